-- :CodectxContext shows the prefix layout in a scratch buffer; :CodectxStatus summarizes the
-- server's status; the <Plug> mappings exist; the code actions "Explain selection" and "Ask
-- about selection" answer in the ask float.
local h = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)), 'harness.lua'))

h.load_plugin()
local client = h.start('util.py')

local messages = {}
vim.notify = function(message, level)
  messages[#messages + 1] = { message = message, level = level }
end

vim.cmd('CodectxContext')
h.wait('the context buffer', function()
  return vim.fn.bufnr('codectx://context') ~= -1
end)
local buf = vim.fn.bufnr('codectx://context')
local layout = h.command(client, 'codectx.showContext')
h.check(h.buffer_text(buf) == vim.trim(layout.markdown), 'the buffer holds the markdown layout',
  { buffer = h.buffer_text(buf), markdown = layout.markdown })
h.check(h.buffer_text(buf):find('| util.py |', 1, true), 'util.py is in the layout')
h.check(vim.fn.bufwinid(buf) ~= -1 and not vim.bo[buf].modifiable and vim.bo[buf].buftype == 'nofile',
  'a shown, read-only scratch buffer')
vim.cmd('CodectxContext')
h.wait('the second :CodectxContext', function()
  return #vim.fn.win_findbuf(buf) == 1 and #vim.api.nvim_list_wins() == 2
end)

vim.cmd('CodectxStatus')
h.wait('the status message', function()
  return #messages > 0
end)
local status = messages[1].message
h.log(status)
h.check(messages[1].level == vim.log.levels.INFO, 'status is info', messages[1])
h.check(vim.startswith(status, 'codectx: ready, model '), 'status says ready', status)
h.check(status:find('asks 0, hovers 0', 1, true), 'status shows the counters', status)
local failed = require('codectx').format_status({ ready = false, model = vim.NIL, loadError = 'model not found: nope' })
h.check(vim.deep_equal(failed, { 'codectx: the model did not load: model not found: nope' }),
  'a failed load is said, not shown as loading', failed)

for _, lhs in ipairs({ '<Plug>(codectx-ask)', '<Plug>(codectx-context)', '<Plug>(codectx-status)' }) do
  h.check(vim.fn.maparg(lhs, 'n') ~= '', lhs .. ' is mapped in normal mode')
end
h.check(vim.fn.maparg('<Plug>(codectx-ask)', 'x') ~= '', '<Plug>(codectx-ask) is mapped in visual mode')

-- Code actions go through Neovim's own code_action(): list, pick (vim.ui.select), resolve,
-- then the client command registered by plugin/codectx.lua.
local ask = require('codectx.ask')
local function code_action(title)
  local before = ask.last
  vim.ui.select = function(items, _, on_choice)
    for _, item in ipairs(items) do
      if item.action.title == title then
        return on_choice(item)
      end
    end
    h.fail('no code action ' .. title, items)
  end
  vim.api.nvim_set_current_win(vim.fn.bufwinid(vim.fn.bufnr('util.py')))
  vim.lsp.buf.code_action({ range = { start = { 4, 0 }, ['end'] = { 6, 0 } } })
  h.wait(title .. ' to answer', function()
    return ask.last ~= before and (ask.last.result ~= nil or ask.last.error ~= nil)
  end)
  local answer = ask.last
  h.check(answer.error == nil, title .. ' answered', answer.error)
  h.check(h.buffer_text(answer.buf) == answer.result.text, title .. ': the float holds the answer')
  local title_chunks = vim.api.nvim_win_get_config(answer.win).title
  vim.api.nvim_win_close(answer.win, true)
  return vim.inspect(title_chunks)
end
h.check(code_action('codectx: Explain selection'):find('Explain the selected code.', 1, true),
  'Explain selection asks to explain')
vim.ui.input = function(_, on_confirm)
  on_confirm('What is this for?')
end
h.check(code_action('codectx: Ask about selection'):find('What is this for?', 1, true),
  'Ask about selection asks the question typed in')
h.check(h.command(client, 'codectx.status').counters.asks == 2, 'the server answered both')
h.log('ok context_status')
