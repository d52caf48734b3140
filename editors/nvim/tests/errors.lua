-- A model that does not exist: the ask float shows the server's error and :checkhealth names
-- the missing model.
local h = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)), 'harness.lua'))

h.load_plugin()
local missing = vim.fs.joinpath(h.workspace, 'no-such-model')
local config = h.server_config()
config.settings.codectx.model.name = missing
vim.lsp.config('codectx', config)
vim.lsp.enable('codectx')
vim.cmd.edit(vim.fs.joinpath(h.workspace, 'util.py'))
local messages = {}
vim.notify = function(message, level)
  messages[#messages + 1] = { message = message, level = level }
end
h.wait('the codectx client to attach', function()
  local client = require('codectx').client(0)
  return client ~= nil and client.initialized
end)

vim.cmd('CodectxAsk What does add do?')
local answer = require('codectx.ask').last
h.wait('the ask to fail', function()
  return answer.error ~= nil or answer.result ~= nil
end)
h.log('error: ' .. vim.inspect(answer.error))
h.check(answer.result == nil and answer.error.code == -31001, 'model not found is error -31001', answer.error)
local text = h.buffer_text(answer.buf)
h.check(vim.startswith(text, 'codectx: ask failed: ') and text:find(answer.error.message, 1, true),
  'the float shows the error', text)
h.check(vim.inspect(vim.api.nvim_win_get_config(answer.win).footer):find('error', 1, true), 'the footer says error')
h.check(#messages >= 1 and messages[#messages].level == vim.log.levels.ERROR, 'the error is notified', messages)
h.check(next(require('codectx.ask').streaming) == nil, 'nothing is left streaming')
vim.api.nvim_win_close(answer.win, true)

vim.cmd('checkhealth codectx')
local report = h.buffer_text(0)
h.log(report)
h.check(report:find('ERROR model: ' .. vim.pesc(missing) .. ' does not exist'), 'health names the missing model', report)
h.check(report:find('ERROR codectx: the model did not load: Model not found', 1, true),
  'health says the model did not load, and why', report)
h.log('ok errors')
