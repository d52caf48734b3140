-- :checkhealth codectx, first with a missing executable and no client, then with a `codectx`
-- that is pip's /bin/sh launcher, then against the running server.
local h = dofile(vim.fs.joinpath(vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)), 'harness.lua'))

h.load_plugin()

--- Runs :checkhealth codectx and returns the report's text.
local function checkhealth()
  vim.cmd('checkhealth codectx')
  local text = h.buffer_text(0)
  vim.api.nvim_buf_delete(0, { force = true })
  return text
end

local function expect(report, pattern, what)
  h.check(report:find(pattern), what .. ' (pattern ' .. pattern .. ')', report)
end

vim.lsp.config('codectx', { cmd = { 'codectx-not-installed', 'serve' } })
local missing = checkhealth()
h.log(missing)
expect(missing, 'OK Neovim 0%.1[1-9]', 'Neovim version')
expect(missing, 'ERROR `codectx%-not%-installed` is not executable', 'missing executable')
expect(missing, 'WARNING not enabled', 'no client')

-- pip writes this launcher instead of a `#!python` line when the venv's path is long or has
-- spaces: sh runs line 2 (exec the Python on this file), Python reads lines 2-3 as a string.
local python = os.getenv('CODECTX_TEST_PYTHON')
local bin = vim.fs.joinpath(vim.fn.tempname(), 'my tools', 'bin')
vim.fn.mkdir(bin, 'p')
local launcher = vim.fs.joinpath(bin, 'codectx')
vim.fn.writefile({
  '#!/bin/sh',
  ([['''exec' "%s" "$0" "$@"]]):format(python),
  "' '''",
  'import sys',
  'from server.cli import main',
  'sys.exit(main())',
}, launcher)
vim.fn.setfperm(launcher, 'rwxr-xr-x')
local config = h.server_config()
config.cmd = { launcher, 'serve' }
vim.lsp.config('codectx', config)
local launched = checkhealth()
h.log(launched)
expect(launched, 'OK cmd: ' .. vim.pesc(launcher .. ' serve'), 'the launcher is the executable')
expect(launched, 'OK python: %S+ %(' .. vim.pesc(python) .. '%)', 'the doctor ran in the python the launcher execs')
expect(launched, 'OK cache dir: ' .. vim.pesc(os.getenv('CODECTX_HOME')) .. ' writable', 'cmd_env reaches the doctor')
h.check(not launched:find('ERROR'), 'no errors with the launcher', launched)

local client = h.start('util.py')
local report = checkhealth()
h.log(report)
expect(report, 'OK cmd: ' .. vim.pesc(os.getenv('CODECTX_TEST_PYTHON')), 'executable')
expect(report, 'OK python: %S+ %(' .. vim.pesc(os.getenv('CODECTX_TEST_PYTHON')) .. '%)', 'the doctor ran in the python of cmd')
for _, check in ipairs({ 'python', 'mlx', 'blas', 'default model', 'cache dir' }) do
  expect(report, '[OK|WARNING] ' .. vim.pesc(check) .. ': ', 'doctor line ' .. check)
end
expect(report, 'OK cache dir: ' .. vim.pesc(os.getenv('CODECTX_HOME')) .. ' writable', 'cmd_env reaches the doctor')
expect(report, 'OK model: ' .. vim.pesc(os.getenv('CODECTX_TEST_MODEL')), 'configured model exists')
expect(report, ('OK client %d: root '):format(client.id), 'running client')
expect(report, 'OK codectx: ready, model ', 'server status')
h.check(not report:find('ERROR'), 'no errors with a working setup', report)
h.log('ok health')
