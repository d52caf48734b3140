--- `:checkhealth codectx`: Neovim, the server executable, its Python (through `codectx doctor`),
--- the configured model and the running clients.
local M = {}

local health = vim.health
local DOCTOR_TIMEOUT_MS = 60000
local STATUS_TIMEOUT_MS = 5000

--- The command that runs `codectx doctor` where the server runs: with the `python` option, or
--- when `cmd[1]` is a Python, `python -m server.cli doctor`; else `cmd` up to its `serve` with
--- `doctor` instead (so `codectx doctor` for `codectx serve`). The `codectx` console script is
--- run itself, not its interpreter: its launcher may be a `#!` line or, when the venv's path is
--- long or has spaces, a `/bin/sh` script that execs the Python.
---@param cmd string[]
---@param exe string Full path of `cmd[1]`.
---@return string[]
local function doctor_command(cmd, exe)
  local python = require('codectx.config').options.python
  if not python and vim.fs.basename(exe):match('^python') then
    python = exe
  end
  if python then
    return { python, '-m', 'server.cli', 'doctor' }
  end
  local doctor = { exe }
  for i = 2, #cmd do
    if cmd[i] == 'serve' then
      break
    end
    doctor[#doctor + 1] = cmd[i]
  end
  if #doctor == #cmd then -- no `serve`: the executable's own subcommand
    doctor = { exe }
  end
  doctor[#doctor + 1] = 'doctor'
  return doctor
end

--- Reports each line of the doctor (Python, MLX, BLAS, default model, cache).
---@param command string[] See `doctor_command`.
local function check_doctor(command, env)
  local shown = table.concat(command, ' ')
  local ok, run = pcall(vim.system, command, { env = env, text = true })
  if not ok then
    health.error(('cannot run `%s`: %s'):format(shown, run))
    return
  end
  local done = run:wait(DOCTOR_TIMEOUT_MS)
  local lines = vim.split(done.stdout or '', '\n', { trimempty = true })
  if #lines == 0 then
    health.error(('`%s` failed (exit %s): %s'):format(shown, done.code, vim.trim(done.stderr or '')), {
      'Install codectx where the server runs: pip install -e /path/to/codectx',
      "or name its Python: require('codectx').setup({ python = '/path/to/.venv/bin/python' })",
    })
    return
  end
  local report = { ok = health.ok, FAIL = health.error, warn = health.warn }
  for _, line in ipairs(lines) do
    local status, rest = line:match('^(%S+)%s+(.+)$')
    if report[status] then
      report[status](rest)
    elseif line:match('^ready:') then
      health.info('codectx doctor: ' .. line)
    end
  end
end

--- The configured model (`settings.codectx.model.name`): a path must exist.
local function check_model(settings)
  local model = vim.tbl_get(settings or {}, 'codectx', 'model', 'name') or 'smollm2-135m'
  if model == 'smollm2-135m' then
    health.ok('model: the default (smollm2-135m); see "default model" above')
  elseif model:match('^[/~.]') then
    local path = vim.fs.normalize(model)
    if vim.uv.fs_stat(path) then
      health.ok('model: ' .. path)
    else
      health.error('model: ' .. path .. ' does not exist', { 'Fix settings.codectx.model.name' })
    end
  else
    health.info('model: ' .. model .. ' (a hub id: needs access to the model hub on first use)')
  end
end

--- Each running client, with the server's own `codectx.status`.
local function check_clients()
  local clients = vim.lsp.get_clients({ name = 'codectx' })
  if #clients == 0 then
    if vim.lsp.is_enabled('codectx') then
      health.warn('enabled, but no client is running', { 'Open a file of one of its filetypes in the repository' })
    else
      health.warn('not enabled', { "Add vim.lsp.enable('codectx') to your config" })
    end
    return
  end
  local format_status = require('codectx').format_status
  for _, client in ipairs(clients) do
    health.ok(('client %d: root %s, position encoding %s'):format(
      client.id, client.root_dir or '-', client.offset_encoding))
    local reply = client:request_sync('workspace/executeCommand', { command = 'codectx.status' }, STATUS_TIMEOUT_MS)
    if not reply or reply.err then
      health.warn('codectx.status did not answer: ' .. (reply and reply.err.message or 'timeout'))
    elseif reply.result.ready then
      health.ok(table.concat(format_status(reply.result), '; '))
    elseif type(reply.result.loadError) == 'string' then
      health.error(table.concat(format_status(reply.result), '; '), { 'Fix the model setting, then :LspRestart' })
    else
      health.warn(table.concat(format_status(reply.result), '; '), { 'The model is still loading, or failed to load: see :messages' })
    end
  end
end

--- The server command: `cmd[1]` must be executable. Returns its full path.
---@param cmd string[]|fun(...): any
---@return string?
local function check_executable(cmd)
  if type(cmd) ~= 'table' then
    health.info('cmd is a function: not checked')
    return nil
  end
  local exe = vim.fn.exepath(cmd[1])
  if exe == '' then
    health.error(('`%s` is not executable'):format(cmd[1]), {
      'Install codectx (pip install -e /path/to/codectx) and put its bin directory on PATH',
      "or set the command: vim.lsp.config('codectx', { cmd = { '/path/to/.venv/bin/codectx', 'serve' } })",
    })
    return nil
  end
  health.ok(('cmd: %s (%s)'):format(table.concat(cmd, ' '), exe))
  return exe
end

function M.check()
  health.start('codectx: Neovim')
  if vim.fn.has('nvim-0.11') == 1 then
    health.ok('Neovim ' .. tostring(vim.version()))
  else
    health.error('Neovim 0.11 or newer is required (vim.lsp.config)')
  end

  health.start('codectx: server executable')
  local config = vim.lsp.config.codectx
  if not config then
    health.error("no vim.lsp.config for 'codectx'", { "Put editors/nvim on 'runtimepath' (it holds lsp/codectx.lua)" })
    return
  end
  local exe = check_executable(config.cmd)

  if exe then
    health.start('codectx: Python and model')
    check_doctor(doctor_command(config.cmd, exe), config.cmd_env)
    check_model(config.settings)
  end

  health.start('codectx: client')
  check_clients()
end

return M
