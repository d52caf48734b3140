-- Issue 17's answers in Neovim, on a tiny model whose greedy answers loop: K shows the static
-- card with the pending line at once and the model's answer on a later K; an empty question is
-- refused and the float says why; `:CodectxContext {question}` shows the focus; a looping answer
-- stops with `repetition` in the float's footer and the status counts it by that outcome.
local h = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)), 'harness.lua'))
local PENDING = assert(os.getenv('CODECTX_TEST_PENDING_LINE'), 'CODECTX_TEST_PENDING_LINE is not set')
local ANSWER_TOKENS = 96 -- more than the loop guard's rule needs to fire first (engine/loop_guard.py)

h.load_plugin()
local client, bufnr = h.start('main.py', {
  ask = { maxTokens = ANSWER_TOKENS },
  -- The defaults' budget (a hover never waits for the model); nothing prepared before K.
  hover = { latencyBudgetMs = 0, prefetch = 0, prefetchHeads = false },
})
local messages = {}
vim.notify = function(message, level)
  messages[#messages + 1] = { message = message, level = level }
end

--- Repeats `request(reply)` (one at a time) until a reply satisfies `accept`; returns that reply.
local function until_accepted(what, request, accept)
  local accepted, in_flight = nil, false
  h.wait(what, function()
    if not in_flight then
      in_flight = true
      request(function(value)
        in_flight = false
        if accept(value) then
          accepted = value
        end
      end)
    end
    return accepted ~= nil
  end)
  return accepted
end

-- 1. K on `add` in `print(greet("café"), add(1, 2))`: the card at once, then the answer.
local row = 5
local line = vim.api.nvim_buf_get_lines(bufnr, row - 1, row, true)[1]
local col = assert(line:find('add(', 1, true))
vim.api.nvim_win_set_cursor(0, { row, col })
local position = vim.lsp.util.make_position_params(0, client.offset_encoding)

--- K (vim.lsp.buf.hover): the text of the hover float it opens (an open one is closed first).
local function hover_float()
  local old = vim.b[bufnr].lsp_floating_preview
  if old and vim.api.nvim_win_is_valid(old) then
    vim.api.nvim_win_close(old, true)
  end
  vim.lsp.buf.hover()
  local win
  h.wait('the hover float', function()
    win = vim.b[bufnr].lsp_floating_preview
    return win ~= nil and win ~= old and vim.api.nvim_win_is_valid(win)
  end)
  return h.buffer_text(vim.api.nvim_win_get_buf(win))
end

local card = hover_float()
h.log('first hover: ' .. card)
h.check(card:find('**add** (function, `util.py:4`)', 1, true), 'the card names add and its place', card)
h.check(card:find('def add(a, b):', 1, true) and card:find('Returns a + b.', 1, true),
  'the card shows the signature and the docstring', card)
h.check(vim.endswith(card, PENDING), 'the card ends with the pending line', card)
local value = until_accepted('the model answer in the hover', function(reply)
  client:request('textDocument/hover', position, function(err, result)
    h.check(err == nil and result ~= nil, 'hover answered', err)
    reply(result.contents.value)
  end, bufnr)
end, function(text)
  return vim.startswith(vim.split(text, '\n\n', { plain = true })[2], '`add`') -- the explanation
end)
h.check(not value:find(PENDING, 1, true), 'the answer has no pending line', value)
local shown = hover_float()
h.log('later hover: ' .. shown)
h.check(shown == value, 'K shows the answer', { float = shown, hover = value })
h.check(vim.startswith(shown, '**add** (function, `util.py:4`)') and shown:find('def add(a, b):', 1, true),
  'the answer keeps the card', shown)
local state = h.command(client, 'codectx.status')
h.check(state.counters.hoverCacheHits >= 1 and (state.counters.outcomes.hover or {}).error == nil,
  'the answer came from the hover cache; no hover failed', state.counters)

-- 2. An empty (blank) question: refused with InvalidParams (-32602), shown in the float.
local ask = require('codectx.ask')
local refused = ask.ask(' \t ')
h.wait('the refusal', function()
  return refused.error ~= nil or refused.result ~= nil
end)
h.check(refused.result == nil and refused.error.code == -32602, 'a blank question is InvalidParams', refused.error)
h.check(refused.error.message:find('question is empty', 1, true), 'the message says the question is empty',
  refused.error)
local text = h.buffer_text(refused.buf)
h.check(text == 'codectx: ask failed: ' .. refused.error.message, 'the float shows why', text)
h.check(vim.inspect(vim.api.nvim_win_get_config(refused.win).footer):find('error', 1, true), 'the footer says error')
h.check(#messages == 1 and messages[1].level == vim.log.levels.ERROR, 'the refusal is notified', messages)
vim.api.nvim_win_close(refused.win, true)
h.check(h.command(client, 'codectx.status').counters.asks == 0, 'a refused question is not an ask')

-- 3. :CodectxContext {question}: the context buffer ends with the focus of that question.
local question = 'What does greet() return?'
local focused = h.command(client, 'codectx.showContext', { question = question })
local items = vim.tbl_map(function(item)
  return item.path .. ' ' .. item.name
end, focused.focus.items)
h.check(vim.deep_equal(items, { 'util.py greet' }), 'the question focuses greet', focused.focus)
vim.cmd('CodectxContext ' .. question)
local context
h.wait('the context buffer with the focus', function()
  context = vim.fn.bufnr('codectx://context')
  return context ~= -1 and h.buffer_text(context) == vim.trim(focused.markdown)
end)
local layout = h.buffer_text(context)
h.check(layout:find('util.py:9-10 greet', 1, true) and layout:find('named in the question (greet())', 1, true),
  'the buffer shows greet and why', layout)
vim.cmd('CodectxContext')
h.wait('the context buffer without a focus', function()
  return not h.buffer_text(context):find('named in the question', 1, true)
end)
vim.api.nvim_set_current_win(vim.fn.bufwinid(bufnr))

-- 4. A looping answer: the loop guard stops it, the footer says `repetition`.
vim.cmd('CodectxAsk What does add do?')
local looped = ask.last
h.wait('the looping answer to end', function()
  return looped.result ~= nil or looped.error ~= nil
end)
h.check(looped.error == nil, 'the ask answered', looped.error)
local result = looped.result
h.log(('looped answer: %q, %s'):format(result.text, vim.inspect(result.metrics)))
h.check(result.finishReason == 'repetition' and looped.finish == 'repetition',
  'the answer and its stream ended as repetition', { result = result.finishReason, stream = looped.finish })
local m = result.metrics
h.check(m.decode_tokens < ANSWER_TOKENS and m.loop_period >= 1 and m.loop_tokens >= 2 * m.loop_period,
  'the guard stopped it early, on a repeated tail', m)
h.check(h.buffer_text(looped.buf) == result.text, "the float's text is the answer")
local footer = vim.inspect(vim.api.nvim_win_get_config(looped.win).footer)
h.check(footer:find(' repetition · ', 1, true), 'the footer shows repetition', footer)
state = h.command(client, 'codectx.status')
h.check(state.counters.asks == 1 and vim.deep_equal(state.counters.outcomes.ask, { repetition = 1 }),
  'the status counts the ask by its outcome', state.counters)
h.log('ok answers')
