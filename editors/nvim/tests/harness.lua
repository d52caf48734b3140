-- Shared steps of the headless end-to-end scripts (run by tests/editors/test_nvim_plugin.py):
-- load the plugin from this checkout, point `codectx` at the real server with a tiny model,
-- wait on predicates (never sleeps), fail with a message (exit status 1).
local M = {}

M.plugin = vim.fs.dirname(vim.fs.dirname(vim.fs.normalize(debug.getinfo(1, 'S').source:sub(2))))
M.workspace = assert(os.getenv('CODECTX_TEST_WORKSPACE'), 'CODECTX_TEST_WORKSPACE is not set')
M.timeout_ms = tonumber(os.getenv('CODECTX_TEST_TIMEOUT_MS') or '120000')

--- Fails the script: prints `message` (and `detail`) and exits with status 1.
function M.fail(message, detail)
  io.stderr:write('FAIL: ' .. message .. '\n')
  if detail ~= nil then
    io.stderr:write(vim.inspect(detail) .. '\n')
  end
  io.stderr:flush()
  os.exit(1)
end

--- Fails unless `cond`.
function M.check(cond, message, detail)
  if not cond then
    M.fail(message, detail)
  end
end

--- Waits until `predicate()` is true (events are processed meanwhile); fails on timeout.
function M.wait(what, predicate, timeout_ms)
  if not vim.wait(timeout_ms or M.timeout_ms, predicate, 10) then
    M.fail('timed out waiting for ' .. what)
  end
end

function M.log(message)
  io.stdout:write(message .. '\n')
  io.stdout:flush()
end

--- Loads plugin/codectx.lua from this checkout (`--clean` loads no plugins).
function M.load_plugin()
  vim.opt.runtimepath:prepend(M.plugin)
  vim.cmd.runtime('plugin/codectx.lua')
end

--- The server command of the test: this checkout's `codectx serve` in the test's Python.
function M.server_config()
  return {
    cmd = { assert(os.getenv('CODECTX_TEST_PYTHON')), '-m', 'server.serve_cmd', '--log-level', 'WARNING' },
    cmd_env = { PYTHONPATH = assert(os.getenv('CODECTX_TEST_REPO')), CODECTX_HOME = assert(os.getenv('CODECTX_HOME')) },
    settings = {
      codectx = {
        model = { name = assert(os.getenv('CODECTX_TEST_MODEL')), kvBits = 16, prefillChunk = 16 },
        ask = { maxTokens = 12 },
        hover = { maxTokens = 8, latencyBudgetMs = 60000 },
        warmup = { enabled = false },
        memory = { archiveEnabled = false },
      },
    },
  }
end

--- Runs a codectx command synchronously (events keep flowing); fails on an error reply.
function M.command(client, name, argument)
  local reply
  require('codectx').execute(client, name, argument, function(err, result)
    reply = { err = err, result = result }
  end)
  M.wait(name, function()
    return reply ~= nil
  end)
  M.check(reply.err == nil, name .. ' failed', reply.err)
  return reply.result
end

--- Configures and enables codectx, edits `file` of the workspace and waits until a client is
--- attached to it and the model is loaded. Returns the client and the buffer.
--- Starts the server on `file`; `settings` (optional) are merged into the codectx settings.
function M.start(file, settings)
  local config = M.server_config()
  config.settings.codectx = vim.tbl_deep_extend('force', config.settings.codectx, settings or {})
  vim.lsp.config('codectx', config)
  vim.lsp.enable('codectx')
  vim.cmd.edit(vim.fs.joinpath(M.workspace, file))
  local bufnr = vim.api.nvim_get_current_buf()
  local codectx = require('codectx')
  M.wait('the codectx client to attach', function()
    local client = codectx.client(bufnr)
    return client ~= nil and client.initialized and vim.lsp.buf_is_attached(bufnr, client.id)
  end)
  local client = codectx.client(bufnr)
  -- codectx.showContext waits for the model load (and fails if the load fails).
  M.command(client, 'codectx.showContext')
  M.check(M.command(client, 'codectx.status').ready, 'codectx.status is not ready after the load')
  return client, bufnr
end

--- The text of a buffer, lines joined with '\n'.
function M.buffer_text(buf)
  return table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, true), '\n')
end

return M
