-- The commands say why no server serves the buffer (not enabled; exited), and a server that
-- dies while it answers (SIGKILL mid-stream) ends the answer: the footer says so, nothing stays
-- streaming, and `:edit` starts a new server that answers.
local h = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)), 'harness.lua'))
local LONG = 2000 -- still decoding when the server is killed (the model has no end-of-sequence token)

h.load_plugin()
local messages = {}
vim.notify = function(message, level)
  messages[#messages + 1] = { message = message, level = level }
end

--- The message of the last ERROR notification, or nil.
local function last_error()
  for i = #messages, 1, -1 do
    if messages[i].level == vim.log.levels.ERROR then
      return messages[i].message
    end
  end
end

-- 1. Not enabled: the message says how to enable it.
vim.cmd('CodectxStatus')
h.check(last_error() == "codectx: the language server is not enabled: add vim.lsp.enable('codectx') to your config",
  'the message says the server is not enabled', messages)

-- 2. The server is killed while an answer streams in.
local client, bufnr = h.start('util.py', { generation = { loopGuard = false }, focus = { enabled = false } })
require('codectx').setup({ max_tokens = LONG })
local ask = require('codectx.ask')
vim.cmd('CodectxAsk Write a long essay about util.py.')
local answer = ask.last
h.wait('the first streamed text', function()
  return answer.text ~= ''
end)
local servers = vim.tbl_filter(function(pid) -- the server: Neovim's one Python child
  local proc = vim.api.nvim_get_proc(pid)
  return proc ~= nil and (proc.name or ''):lower():find('python', 1, true) ~= nil
end, vim.api.nvim_get_proc_children(vim.fn.getpid()))
h.check(#servers == 1, 'one server process', servers)
vim.uv.kill(servers[1], 'sigkill')
h.wait('the answer to end with the server', function()
  return answer.exited ~= nil
end)
h.check(answer.exited.signal == 9 and answer.result == nil and answer.error == nil, 'ended by the exit', answer.exited)
h.check(next(ask.streaming) == nil, 'nothing is left streaming', ask.streaming)
local footer = vim.inspect(vim.api.nvim_win_get_config(answer.win).footer)
h.check(footer:find('server exited', 1, true), 'the footer says the server exited', footer)
local text = h.buffer_text(answer.buf)
h.check(vim.startswith(text, answer.text) and vim.endswith(text,
  '\n\ncodectx: the language server exited (signal 9) before the answer finished'), 'the float says why', text)
vim.cmd.normal('q')
h.check(not vim.api.nvim_win_is_valid(answer.win) and not answer.cancelled, 'q closes it; nothing to cancel')

-- 3. Until a new server runs, the commands say that this one exited (not "enable it").
h.wait('the client to go', function()
  return vim.lsp.get_client_by_id(client.id) == nil
end)
local before = ask.last
vim.cmd('CodectxAsk What does add do?')
h.check(ask.last == before, 'no answer without a server')
local message = last_error() or ''
h.log('after the crash: ' .. message)
h.check(message:find('codectx: the language server for ' .. client.root_dir .. ' exited (signal 9): ', 1, true),
  'the message says the server exited', messages)

-- 4. :edit starts a new server for the buffer, and it answers.
vim.cmd.edit()
local codectx = require('codectx')
h.wait('a new client', function()
  local new = codectx.client(bufnr)
  return new ~= nil and new.id ~= client.id and new.initialized and vim.lsp.buf_is_attached(bufnr, new.id)
end)
h.command(codectx.client(bufnr), 'codectx.showContext')
require('codectx').setup({ max_tokens = 8 })
vim.cmd('CodectxAsk What does add do?')
local again = ask.last
h.wait('the answer of the new server', function()
  return again.result ~= nil or again.error ~= nil
end)
h.check(again ~= before and again.error == nil and again.client.id ~= client.id, 'the new server answered', again.error)
h.log('ok crash')
