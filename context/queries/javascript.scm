; codectx tags for JavaScript (see python.scm for the capture names).

(function_declaration name: (identifier) @name) @definition.function
(generator_function_declaration name: (identifier) @name) @definition.function
(class_declaration name: (identifier) @name) @definition.class
(method_definition name: (property_identifier) @name) @definition.method
(lexical_declaration
  (variable_declarator name: (identifier) @name value: [(arrow_function) (function_expression)])) @definition.function
(variable_declaration
  (variable_declarator name: (identifier) @name value: [(arrow_function) (function_expression)])) @definition.function

(call_expression function: (identifier) @reference)
(call_expression function: (member_expression property: (property_identifier) @reference))
(new_expression constructor: (identifier) @reference)
(class_heritage (identifier) @reference)

(import_statement source: (string (string_fragment) @import.module))
(export_statement source: (string (string_fragment) @import.module))
((call_expression
   function: (identifier) @_require
   arguments: (arguments . (string (string_fragment) @import.module)))
 (#eq? @_require "require"))
