--- Options of the codectx Neovim plugin (the server's own settings live in
--- `vim.lsp.config('codectx', { settings = { codectx = { ... } } })`).
local M = {}

---@class codectx.FloatOptions
---@field width number Fraction of the editor's columns (<= 1) or a column count.
---@field height number Fraction of the editor's lines (<= 1) or a line count.
---@field border string|string[] Any `nvim_open_win` border.

---@class codectx.Options
---@field float codectx.FloatOptions The answer window.
---@field max_tokens integer? Answer length of `:CodectxAsk`; nil uses the server's `ask.maxTokens`.
---@field python string? Interpreter `:checkhealth codectx` runs the doctor with (`python -m server.cli doctor`); nil runs it like `cmd` (`codectx doctor` for `codectx serve`).

---@type codectx.Options
M.defaults = {
  float = { width = 0.7, height = 0.6, border = 'rounded' },
  max_tokens = nil,
  python = nil,
}

---@type codectx.Options
M.options = vim.deepcopy(M.defaults)

--- Merges `opts` over the current options.
---@param opts codectx.Options|table|nil
---@return codectx.Options
function M.merge(opts)
  M.options = vim.tbl_deep_extend('force', M.options, opts or {})
  return M.options
end

return M
