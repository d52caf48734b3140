; codectx tags for Rust (see python.scm for the capture names).
; A `mod name;` without a body pulls in a file: captured as @import.mod.

(function_item name: (identifier) @name) @definition.function
(function_signature_item name: (identifier) @name) @definition.function
(struct_item name: (type_identifier) @name) @definition.struct
(enum_item name: (type_identifier) @name) @definition.enum
(union_item name: (type_identifier) @name) @definition.union
(trait_item name: (type_identifier) @name) @definition.trait
(type_item name: (type_identifier) @name) @definition.type
(const_item name: (identifier) @name) @definition.constant
(macro_definition name: (identifier) @name) @definition.macro
(mod_item name: (identifier) @name body: (_)) @definition.module

(call_expression function: (identifier) @reference)
(call_expression function: (field_expression field: (field_identifier) @reference))
(call_expression function: (scoped_identifier name: (identifier) @reference))
(macro_invocation macro: (identifier) @reference)
(type_identifier) @reference

(use_declaration argument: (_) @import.module)
(mod_item name: (identifier) @import.mod !body)
