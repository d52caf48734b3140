-- :CodectxContext shows the prefix layout in a scratch buffer; :CodectxStatus summarizes the
-- server's status; the <Plug> mappings exist.
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

for _, lhs in ipairs({ '<Plug>(codectx-ask)', '<Plug>(codectx-context)', '<Plug>(codectx-status)' }) do
  h.check(vim.fn.maparg(lhs, 'n') ~= '', lhs .. ' is mapped in normal mode')
end
h.check(vim.fn.maparg('<Plug>(codectx-ask)', 'x') ~= '', '<Plug>(codectx-ask) is mapped in visual mode')
h.log('ok context_status')
