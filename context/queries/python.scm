; codectx tags for Python.
; @definition.<kind> spans a definition and @name is its name; @reference is a used name;
; @import.module is a module path and @import.name a name imported from it.

(class_definition name: (identifier) @name) @definition.class

(function_definition name: (identifier) @name) @definition.function

(module (expression_statement (assignment left: (identifier) @name) @definition.constant))

(call function: (identifier) @reference)
(call function: (attribute attribute: (identifier) @reference))
(argument_list (identifier) @reference)
(class_definition superclasses: (argument_list (identifier) @reference))
(type (identifier) @reference)
(decorator (identifier) @reference)

(import_statement name: (dotted_name) @import.module)
(import_statement name: (aliased_import name: (dotted_name) @import.module))
(import_from_statement module_name: (_) @import.module name: (dotted_name) @import.name)
(import_from_statement module_name: (_) @import.module name: (aliased_import name: (dotted_name) @import.name))
(import_from_statement module_name: (_) @import.module (wildcard_import))
