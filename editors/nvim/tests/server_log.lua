-- The server at its default log level: Neovim writes every stderr line of a server to lsp.log
-- as [ERROR], so the server's start-up, hovers and asks must write nothing there; its log
-- arrives as window/logMessage, which Neovim logs at the message's own level.
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

-- A session: K on `add` until the model's answer shows, a streamed answer, a blank question
-- (refused: the server logs that at INFO). Still no [ERROR] line.
vim.api.nvim_win_set_cursor(0, { 4, 4 }) -- `def add(a, b):`
local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
local hovered
h.wait('the hover answer', function()
  if hovered == nil then
    hovered = false
    client:request('textDocument/hover', params, function(_, result)
      local value = result and result.contents.value or ''
      hovered = not value:find('explanation pending', 1, true) and value or nil
    end, bufnr)
  end
  return hovered ~= false and hovered ~= nil
end)
h.check(vim.startswith(hovered, '**add** (function, `util.py:4`)'), 'the hover shows add', hovered)
local ask = require('codectx.ask')
vim.cmd('CodectxAsk What does add do?')
local answered = ask.last
local refused = ask.ask('   ')
h.wait('the answer and the refusal', function()
  return (answered.result or answered.error) and (refused.result or refused.error)
end)
h.check(answered.result and answered.result.text ~= '', 'the ask answered', answered.error)
h.check(refused.error and refused.error.code == -32602, 'the blank question is refused', refused.error)
h.wait('the refusal logged as a logMessage', function()
  return log_text():find('request %d+ failed: the question is empty') ~= nil
end)
text = log_text()
local refusal = text:match('%[(%u+)%][^\n]*request %d+ failed: the question is empty')
h.check(refusal == 'INFO', 'the refusal is logged at INFO', refusal)
h.check(not text:find('[ERROR]', 1, true), 'no [ERROR] line in lsp.log after hover and ask', text)
local state = h.command(client, 'codectx.status')
h.check(state.counters.asks == 1 and state.counters.hovers >= 1, 'the server counted them', state.counters)
h.log('ok server_log')
