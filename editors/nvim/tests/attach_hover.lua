-- Attach to the real server through lsp/codectx.lua, then hover on a call of `add` in main.py.
local h = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)), 'harness.lua'))

h.load_plugin()
local client, bufnr = h.start('main.py')
h.log(('attached: client %d, root %s, encoding %s'):format(client.id, client.root_dir, client.offset_encoding))
h.check(client.root_dir == vim.fs.normalize(vim.uv.fs_realpath(h.workspace)), 'root_dir is the working directory', client.root_dir)
h.check(vim.bo[bufnr].filetype == 'python', 'main.py has filetype python')

-- Cursor on the `d` of `add(1, 2)` in `    print(greet("café"), add(1, 2))` (a 2-byte é before it).
local row = 5
local line = vim.api.nvim_buf_get_lines(bufnr, row - 1, row, true)[1]
local col = assert(line:find('add(', 1, true))
vim.api.nvim_win_set_cursor(0, { row, col })
local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
local reply = client:request_sync('textDocument/hover', params, h.timeout_ms, bufnr)
h.check(reply and not reply.err and reply.result, 'hover answered', reply)
local hover = reply.result
h.log('hover: ' .. hover.contents.value)
h.check(hover.contents.kind == 'markdown', 'hover is markdown', hover.contents)
h.check(vim.startswith(hover.contents.value, '**add** (function, `util.py:4`)'), 'hover names add and its place', hover.contents.value)
h.check(hover.contents.value:find('def add(a, b):', 1, true), 'hover shows the signature', hover.contents.value)
-- The range comes back in the negotiated encoding and covers exactly `add`.
local first = vim.str_byteindex(line, client.offset_encoding, hover.range.start.character)
local last = vim.str_byteindex(line, client.offset_encoding, hover.range['end'].character)
h.check(hover.range.start.line == row - 1 and line:sub(first + 1, last) == 'add', 'hover range is `add`', hover.range)

local state = h.command(client, 'codectx.status')
h.check(state.counters.hovers == 1, 'the server counted one hover', state.counters)
h.check(state.server.openDocuments == 1, 'main.py is open on the server', state.server)
h.log('ok attach_hover')
