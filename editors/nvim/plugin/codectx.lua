-- codectx user commands and <Plug> mappings. Modules load only when a command runs.
if vim.g.loaded_codectx then
  return
end
vim.g.loaded_codectx = true

vim.api.nvim_create_user_command('CodectxAsk', function(cmd)
  require('codectx.ask').command(cmd)
end, { nargs = '*', range = true, desc = 'codectx: ask about the repository (or the given lines)' })

vim.api.nvim_create_user_command('CodectxContext', function(cmd)
  require('codectx').show_context(cmd.args)
end, { nargs = '*', desc = 'codectx: show the prompt prefix layout (and what a question would focus)' })

vim.api.nvim_create_user_command('CodectxStatus', function()
  require('codectx').show_status()
end, { nargs = 0, desc = 'codectx: show model, warm-up and counters' })

-- Code actions ("Explain selection", "Ask about selection") resolve to these commands; the
-- answer goes to the ask float instead of being dropped.
for _, name in ipairs({ 'codectx.ask', 'codectx.askAboutSelection' }) do
  vim.lsp.commands[name] = function(command, ctx)
    require('codectx.ask').run_command(command, ctx)
  end
end

vim.keymap.set('n', '<Plug>(codectx-ask)', '<Cmd>CodectxAsk<CR>', { desc = 'codectx: ask' })
vim.keymap.set('x', '<Plug>(codectx-ask)', ':CodectxAsk<CR>', { silent = true, desc = 'codectx: ask about the selected lines' })
vim.keymap.set('n', '<Plug>(codectx-context)', '<Cmd>CodectxContext<CR>', { desc = 'codectx: show context' })
vim.keymap.set('n', '<Plug>(codectx-status)', '<Cmd>CodectxStatus<CR>', { desc = 'codectx: status' })
