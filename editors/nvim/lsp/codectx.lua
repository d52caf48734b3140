-- Default configuration of the codectx language server for `vim.lsp.config` (Neovim >= 0.11).
-- Enable it with `vim.lsp.enable('codectx')`; override any field with
-- `vim.lsp.config('codectx', { ... })`. Server settings (docs/protocol.md, "Settings") go in
-- `settings.codectx`; they are also sent as initializationOptions, so the model loads with
-- them from the start.

---@type vim.lsp.Config
return {
  cmd = { 'codectx', 'serve' },
  -- The languages codectx parses with tree-sitter (hover needs their tags). Asking works from
  -- any buffer once a client runs.
  filetypes = {
    'c', 'cpp', 'go', 'java', 'javascript', 'javascriptreact', 'python', 'rust', 'typescript',
    'typescriptreact',
  },
  -- The repository is the unit codectx keeps warm: the git root, else the working directory.
  root_dir = function(bufnr, on_dir)
    on_dir(vim.fs.root(bufnr, { '.git' }) or vim.fn.getcwd())
  end,
  before_init = function(params, config)
    local settings = config.settings and config.settings.codectx
    if type(settings) == 'table' and next(settings) ~= nil then
      params.initializationOptions = settings
    end
  end,
  handlers = {
    ['codectx/stream'] = function(err, params, ctx)
      require('codectx.ask').on_stream(err, params, ctx)
    end,
  },
}
