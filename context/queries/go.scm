; codectx tags for Go (see python.scm for the capture names).

(function_declaration name: (identifier) @name) @definition.function
(method_declaration name: (field_identifier) @name) @definition.method
(type_declaration (type_spec name: (type_identifier) @name) @definition.type)
(const_declaration (const_spec name: (identifier) @name) @definition.constant)

(call_expression function: (identifier) @reference)
(call_expression function: (selector_expression field: (field_identifier) @reference))
(type_identifier) @reference

(import_spec path: (interpreted_string_literal) @import.module)
