-- Two repositories, two servers: a buffer's commands go to the server of its own repository,
-- attached or not (a ranged ask, :CodectxContext); a file of neither gets a clear error. A
-- buffer without a file name gets no client, and a ranged ask from it is refused.
local h = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)), 'harness.lua'))
local REPO2 = assert(os.getenv('CODECTX_TEST_WORKSPACE2'), 'CODECTX_TEST_WORKSPACE2 is not set')

h.load_plugin()
local codectx = require('codectx')
local ask = require('codectx.ask')
local first, first_buf = h.start('util.py')
local messages = {}
vim.notify = function(message, level)
  messages[#messages + 1] = { message = message, level = level }
end

local function real(path)
  return vim.fs.normalize(vim.uv.fs_realpath(path))
end

--- Edits `path`; returns its buffer.
local function edit(path)
  vim.cmd.edit(vim.fn.fnameescape(path))
  return vim.api.nvim_get_current_buf()
end

-- 1. A Python file of the second repository (`.git` at its root) starts a second server.
local beta = edit(vim.fs.joinpath(REPO2, 'beta.py'))
h.wait('the second client to attach', function()
  local client = vim.lsp.get_clients({ name = 'codectx', bufnr = beta })[1]
  return client ~= nil and client.initialized
end)
local second = vim.lsp.get_clients({ name = 'codectx', bufnr = beta })[1]
h.check(second.id ~= first.id and second.root_dir == real(REPO2), 'a client for the second repository',
  { first = first.root_dir, second = second.root_dir })
h.check(codectx.client(beta) == second and codectx.client(first_buf) == first, 'attached buffers keep their client')
h.command(second, 'codectx.showContext')

-- 2. Files no client is attached to (markdown; a new file) go to the server of their
-- repository. The second repository's folder name starts with the first one's.
local notes = edit(vim.fs.joinpath(REPO2, 'NOTES.md'))
local todo = edit(vim.fs.joinpath(h.workspace, 'TODO.md'))
h.check(#vim.lsp.get_clients({ bufnr = notes }) == 0 and #vim.lsp.get_clients({ bufnr = todo }) == 0,
  'no client attached to the markdown buffers')
h.check(codectx.client(notes) == second, "NOTES.md goes to its repository's server", codectx.client(notes).root_dir)
h.check(codectx.client(todo) == first, "TODO.md goes to its repository's server", codectx.client(todo).root_dir)

vim.cmd.buffer(notes)
vim.cmd('1,3CodectxAsk What is in these notes?')
local answer = ask.last
h.wait('the ranged ask from NOTES.md', function()
  return answer.result ~= nil or answer.error ~= nil
end)
h.check(answer.client == second and answer.error == nil, 'the second server answered the lines of NOTES.md',
  { client = answer.client.id, error = answer.error })
vim.api.nvim_win_close(answer.win, true)

vim.cmd('CodectxContext')
local context
h.wait('the context of the second repository', function()
  context = vim.fn.bufnr('codectx://context')
  return context ~= -1 and h.buffer_text(context) ~= ''
end)
local layout = h.buffer_text(context)
h.check(layout:find('| beta.py |', 1, true) and not layout:find('util.py', 1, true),
  ':CodectxContext from NOTES.md shows the second repository', layout)
vim.cmd.only()

-- 3. A file of neither repository: an error that says so, not another repository's server.
local outside = vim.fs.joinpath(vim.fs.dirname(h.workspace), 'elsewhere.md')
edit(outside)
h.check(codectx.client(0) == nil, 'no client for a file outside both roots')
vim.cmd('CodectxStatus')
local last = messages[#messages]
h.log('outside: ' .. vim.inspect(last))
local expected = ('codectx: no language server for %s (running for '):format(
  vim.fs.joinpath(real(vim.fs.dirname(h.workspace)), 'elsewhere.md'))
h.check(last.level == vim.log.levels.ERROR and vim.startswith(last.message, expected), 'the error names the file', last)

-- 4. An unnamed buffer: no root (so no client) even with a codectx filetype; a ranged ask is
-- refused before it reaches a server; an ask without a range goes to the working directory's.
vim.cmd.enew()
local unnamed = vim.api.nvim_get_current_buf()
vim.api.nvim_buf_set_lines(unnamed, 0, -1, true, { 'def zed(x):', '    return x * 2' })
vim.bo[unnamed].filetype = 'python'
local offered
vim.lsp.config.codectx.root_dir(unnamed, function(root)
  offered = root
end)
h.check(offered == nil, 'no root for an unnamed buffer', offered)
h.command(first, 'codectx.status') -- a round trip: a client start scheduled by the filetype has run
h.check(#vim.lsp.get_clients({ bufnr = unnamed, _uninitialized = true }) == 0, 'no client attached to it')
local before = ask.last
vim.cmd('1,2CodectxAsk What does this do?')
h.check(ask.last == before, 'a ranged ask from the unnamed buffer is refused')
h.check(messages[#messages].message
  == 'codectx: cannot ask about lines of an unnamed buffer: it is no file; write it to a file of the repository, '
  .. 'or ask without a range', 'the refusal says why', messages[#messages])
h.check(codectx.client(unnamed) == first, "an ask without a range goes to the working directory's server")
h.log('ok repositories')
