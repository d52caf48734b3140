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
  -- A buffer without a file name gets no client: the server reads files, and such a buffer has
  -- no file URI (`:CodectxAsk` without a range still works from it).
  root_dir = function(bufnr, on_dir)
    if vim.api.nvim_buf_get_name(bufnr) == '' then
      return
    end
    on_dir(vim.fs.root(bufnr, { '.git' }) or vim.fn.getcwd())
  end,
  before_init = function(params, config)
    local settings = config.settings and config.settings.codectx
    if type(settings) == 'table' and next(settings) ~= nil then
      params.initializationOptions = settings
    end
  end,
  -- Ends the answers of a server that exited (a crash included) and remembers the exit for
  -- the commands' messages. Keep calling it if you set your own on_exit (doc: codectx-setup).
  on_exit = function(code, signal, client_id)
    -- A fast event: the client is read now (it is removed soon after), the rest runs later.
    local client = vim.lsp.get_client_by_id(client_id)
    vim.schedule(function()
      require('codectx').exited(client, code, signal)
    end)
  end,
  handlers = {
    ['codectx/stream'] = function(err, params, ctx)
      require('codectx.ask').on_stream(err, params, ctx)
    end,
  },
}
