; codectx tags for Java (see python.scm for the capture names).

(class_declaration name: (identifier) @name) @definition.class
(interface_declaration name: (identifier) @name) @definition.interface
(enum_declaration name: (identifier) @name) @definition.enum
(record_declaration name: (identifier) @name) @definition.class
(method_declaration name: (identifier) @name) @definition.method
(constructor_declaration name: (identifier) @name) @definition.constructor

(method_invocation name: (identifier) @reference)
(object_creation_expression type: (type_identifier) @reference)
(type_identifier) @reference

(import_declaration (scoped_identifier) @import.module)
