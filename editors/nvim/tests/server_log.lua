-- The server at its default log level: Neovim writes every stderr line of a server to lsp.log
-- as [ERROR], so the server's start-up must write nothing there; its log arrives as
-- window/logMessage, which Neovim logs at the message's own level.
local h = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)), 'harness.lua'))

h.load_plugin()
vim.lsp.set_log_level('INFO')
local log_path = vim.lsp.get_log_path()
local config = h.server_config()
config.cmd = { config.cmd[1], config.cmd[2], config.cmd[3] } -- python -m server.serve_cmd: no --log-level
config.cmd_env.CODECTX_STDERR_LEVEL = '' -- the default, whatever the environment says
vim.lsp.config('codectx', config)
vim.lsp.enable('codectx')
vim.cmd.edit(vim.fs.joinpath(h.workspace, 'util.py'))
local bufnr = vim.api.nvim_get_current_buf()
h.wait('the codectx client to attach', function()
  local client = require('codectx').client(bufnr)
  return client ~= nil and client.initialized
end)
local client = require('codectx').client(bufnr)
h.command(client, 'codectx.showContext') -- answers once the model is loaded

local function log_text()
  local file = io.open(log_path, 'r')
  if file == nil then
    return ''
  end
  local text = file:read('*a')
  file:close()
  return text
end
h.wait('the engine start-up line as a logMessage in lsp.log', function()
  return log_text():find('engine started on', 1, true) ~= nil
end)
local text = log_text()
local started = text:match('%[(%u+)%][^\n]*engine started on')
h.check(started == 'INFO', 'the start-up line is logged at INFO', started)
h.check(not text:find('[ERROR]', 1, true), 'no [ERROR] line in lsp.log', text)
h.check(h.command(client, 'codectx.status').ready, 'the server still answers')
h.log('ok server_log')
