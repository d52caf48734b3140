-- :checkhealth codectx, first with a missing executable and no client, then against the
-- running server.
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
