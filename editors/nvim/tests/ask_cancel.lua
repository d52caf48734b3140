-- :CodectxAsk streams into a float whose text equals the answer; q and <C-c> cancel a running
-- answer ($/cancelRequest) and close the float; a later ask still gets the same answer; an ask
-- cancelled before it began leaves nothing streaming.
local h = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)), 'harness.lua'))
local LONG = 2000 -- decode budget large enough to still be running when the script cancels
local SHORT = 48 -- the answers that finish: the test model has no end-of-sequence token
local ENDLESS = 'Write a long essay about util.py.'

h.load_plugin()
-- The random tiny model's long answers repeat themselves: without the loop guard they run
-- until cancelled, which is what this script tests. The model served here has no
-- end-of-sequence token, so every answer runs to its max_tokens unless cancelled.
local client, bufnr = h.start('util.py', { generation = { loopGuard = false }, focus = { enabled = false } })
require('codectx.config').options.max_tokens = SHORT
local ask = require('codectx.ask')
local codectx = require('codectx')

--- Runs `:CodectxAsk` and returns the new answer, its float still open.
local function start_ask(cmdline)
  local before = ask.last
  vim.cmd(cmdline)
  local answer = ask.last
  h.check(answer ~= nil and answer ~= before, cmdline .. ' started an answer')
  h.check(vim.api.nvim_get_current_win() == answer.win, 'the float has the focus')
  h.check(vim.api.nvim_win_get_config(answer.win).relative == 'editor', 'the answer window floats')
  return answer
end

local function finished(cmdline)
  local answer = start_ask(cmdline)
  h.wait(cmdline .. ' to finish', function()
    return answer.result ~= nil or answer.error ~= nil
  end)
  h.check(answer.error == nil, cmdline .. ' answered without error', answer.error)
  h.check(answer.result.finishReason == 'length', cmdline .. ' ran to its max_tokens', answer.result.finishReason)
  return answer
end

-- 1. Streaming: the float's buffer holds exactly the answer, streamed in several deltas.
local deltas = 0
local on_stream = ask.on_stream
ask.on_stream = function(err, params, ctx)
  deltas = deltas + ((params.text ~= '') and 1 or 0)
  on_stream(err, params, ctx)
end
local answer = finished('CodectxAsk What does add do?')
local text = answer.result.text
h.log(('answer (%d deltas): %q'):format(deltas, text))
h.check(text ~= '' and deltas >= 2, 'a streamed, non-empty answer', { text = text, deltas = deltas })
h.check(answer.text == text and h.buffer_text(answer.buf) == text, "the float's text equals the answer",
  { float = h.buffer_text(answer.buf), result = text })
h.check(answer.finish == answer.result.finishReason, 'the stream ended with the same finishReason', answer.finish)
local footer = vim.api.nvim_win_get_config(answer.win).footer
h.check(vim.inspect(footer):find(answer.result.finishReason, 1, true), 'the footer shows the finish reason', footer)
vim.cmd.normal('q')
h.check(not vim.api.nvim_win_is_valid(answer.win), 'q closed the finished answer')
h.check(vim.api.nvim_get_current_buf() == bufnr, 'focus is back in util.py')

-- 2. A range: lines 9-10 (greet, with non-ASCII text) go to the server as the selection.
local ranged = finished('9,10CodectxAsk Explain this.')
h.check(h.buffer_text(ranged.buf) == ranged.result.text, 'the ranged answer fills its float')
vim.api.nvim_win_close(ranged.win, true)

local reference = finished('CodectxAsk Explain greet.')
vim.api.nvim_win_close(reference.win, true)

-- 3. Cancel with q, with <C-c> and by closing the window (:close), each as soon as text streams in.
require('codectx').setup({ max_tokens = LONG })
local closers = {
  q = function()
    vim.api.nvim_feedkeys('q', 'x', false)
  end,
  ['<C-c>'] = function()
    vim.api.nvim_feedkeys(vim.keycode('<C-c>'), 'x', false)
  end,
  [':close'] = function()
    vim.cmd.close()
  end,
}
for n, how in ipairs({ 'q', '<C-c>', ':close' }) do
  local running = start_ask('CodectxAsk ' .. ENDLESS)
  h.wait('the first streamed text', function()
    return running.text ~= ''
  end)
  closers[how]()
  h.check(not vim.api.nvim_win_is_valid(running.win), how .. ' closed the float')
  h.check(running.cancelled, how .. ' sent $/cancelRequest')
  h.wait('the stream to end', function()
    return running.finish ~= nil
  end)
  h.check(running.finish == 'cancelled', 'the stream ended as cancelled', { finish = running.finish, text = running.text })
  h.check(running.result == nil and running.error == nil, 'a cancelled request has no result')
  local state = h.command(client, 'codectx.status')
  h.check(state.counters.cancelled == n, 'the server counted the cancel', state.counters)
  h.log(('cancelled with %s after %d characters'):format(how, #running.text))
end
local state = h.command(client, 'codectx.status')
h.check(state.engine.decode_tokens < LONG, 'the cancelled answers stopped early', state.engine)
-- The one pending request is this codectx.status itself.
h.check(state.server.pendingRequests == 1 and state.server.progressTokens == 0, 'nothing left pending on the server',
  state.server)

-- 4. After the cancels the same question gets the same (greedy) answer.
require('codectx.config').options.max_tokens = SHORT
local after = finished('CodectxAsk Explain greet.')
h.check(after.result.text == reference.result.text, 'same answer after the cancels',
  { before = reference.result.text, after = after.result.text })
h.check(h.buffer_text(after.buf) == after.result.text, 'the float shows it')

-- 5. Cancelled before its answer began (q at once; the same as while the model loads): the
-- server only replies -32800, which Neovim does not hand to the request's handler, and sends no
-- stream end. The reply itself ends the entry.
local quick = ask.ask(ENDLESS)
local quick_id = ('%d:%d'):format(quick.client.id, quick.request_id)
ask.stop(quick)
h.check(quick.cancelled and ask.streaming[quick_id] == quick, 'cancelled at once; the reply is still to come')
local replied = false
vim.api.nvim_create_autocmd('LspRequest', {
  callback = function(ev)
    replied = replied or (ev.data.request_id == quick.request_id and ev.data.request.type == 'complete')
  end,
})
h.wait('the reply to the cancelled request', function()
  return replied
end)
h.wait('the entry to end with the reply', function()
  return ask.streaming[quick_id] == nil
end, 5000)
h.check(quick.finish == 'cancelled' and quick.text == '' and quick.result == nil and quick.error == nil,
  'cancelled before any text', quick)
h.check(next(ask.streaming) == nil, 'nothing is left streaming', ask.streaming)
state = h.command(client, 'codectx.status')
h.check(state.server.pendingRequests == 1, 'nothing left pending on the server', state.server)
h.log('ok ask_cancel')
