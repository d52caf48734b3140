--- codectx for Neovim: the client lookup, commands sent to the server, `:CodectxStatus` and
--- `:CodectxContext`. `:CodectxAsk` lives in `codectx.ask`, `:checkhealth codectx` in
--- `codectx.health`, the language server's defaults in `lsp/codectx.lua`.
local M = {}

M.name = 'codectx'

--- Optional: merges plugin options (see `codectx.config`). Commands work without it.
---@param opts codectx.Options|table|nil
function M.setup(opts)
  require('codectx.config').merge(opts)
end

--- Whether `bufnr` shows a file: it has a name, is no special buffer (`buftype`) and is not
--- named by a URI such as `codectx://context`.
---@param bufnr integer
---@return boolean
function M.is_file(bufnr)
  local name = vim.api.nvim_buf_get_name(bufnr)
  return name ~= '' and vim.bo[bufnr].buftype == '' and not name:match('^%a[%w+.-]*://')
end

--- The file a buffer shows (symlinks resolved), or the working directory for a buffer that is
--- no file (`is_file`): that is where `lsp/codectx.lua` puts the root of such a buffer too.
---@param bufnr integer
---@return string
local function buffer_path(bufnr)
  if not M.is_file(bufnr) then
    return vim.fs.normalize(vim.uv.fs_realpath(vim.fn.getcwd()) or vim.fn.getcwd())
  end
  local name = vim.api.nvim_buf_get_name(bufnr)
  local real = vim.uv.fs_realpath(name)
  if not real then -- a new file: its folder's real path
    local dir = vim.fs.dirname(name)
    real = vim.fs.joinpath(vim.uv.fs_realpath(dir) or dir, vim.fs.basename(name))
  end
  return vim.fs.normalize(real)
end

--- Whether `path` (real, normalized) is `root` or inside it.
local function contains(root, path)
  return vim.fs.relpath(vim.fs.normalize(vim.uv.fs_realpath(root) or root), path) ~= nil
end

--- The root a client serves (the working directory it was started in if it has none).
local function root_of(client)
  return client.root_dir or vim.fn.getcwd()
end

--- How a server process ended, e.g. `signal 9` or `exit code 1`.
---@param code integer
---@param signal integer
---@return string
function M.describe_exit(code, signal)
  return signal ~= 0 and ('signal %d'):format(signal) or ('exit code %d'):format(code)
end

--- The last exit of a codectx server, by the root it served (see `exited`).
---@type table<string, { code: integer, signal: integer }>
M.exits = {}

--- The codectx client of `bufnr`: the one attached to it, else the one whose root holds the
--- buffer's file (the innermost root), never another repository's. Clients that are stopping
--- are left out.
---@param bufnr integer? Defaults to the current buffer.
---@return vim.lsp.Client? client
---@return string? why Without a client: why none serves the buffer (for the user).
function M.client(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local running = vim.tbl_filter(function(client)
    return not client:is_stopped()
  end, vim.lsp.get_clients({ name = M.name }))
  for _, client in ipairs(running) do
    if client.attached_buffers[bufnr] then
      return client
    end
  end
  local path, best = buffer_path(bufnr), nil
  for _, client in ipairs(running) do
    if contains(root_of(client), path) and (not best or #root_of(client) > #root_of(best)) then
      best = client
    end
  end
  if best then
    return best
  end
  if #running == 0 and not vim.lsp.is_enabled(M.name) then
    return nil, "the language server is not enabled: add vim.lsp.enable('codectx') to your config"
  end
  local exited
  for root, exit in pairs(M.exits) do
    if contains(root, path) and (not exited or #root > #exited) then
      exited = root
    end
  end
  if exited then
    local exit = M.exits[exited]
    return nil, ('the language server for %s exited (%s): :edit a file of the repository to start it again; see %s')
      :format(exited, M.describe_exit(exit.code, exit.signal), vim.lsp.get_log_path())
  end
  if #running == 0 then
    return nil, ('no language server is running for %s: open a source file of its repository (a filetype of '
      .. 'lsp/codectx.lua) to start one'):format(path)
  end
  local roots = vim.tbl_map(root_of, running)
  table.sort(roots)
  return nil, ('no language server for %s (running for %s): open a source file of its repository (a filetype '
    .. 'of lsp/codectx.lua) to start one'):format(path, table.concat(roots, ', '))
end

--- Like `client`, but tells the user why there is none: not enabled, not running for this
--- buffer's repository, or exited.
---@param bufnr integer?
---@return vim.lsp.Client?
function M.require_client(bufnr)
  local client, why = M.client(bufnr)
  if not client then
    vim.notify('codectx: ' .. why, vim.log.levels.ERROR)
  end
  return client
end

--- A codectx server exited (`on_exit` of `lsp/codectx.lua`): remembers the exit for `client`'s
--- message and ends the client's answers (no stream end or reply comes any more).
---@param client vim.lsp.Client?
---@param code integer
---@param signal integer
function M.exited(client, code, signal)
  if not client then
    return
  end
  M.exits[root_of(client)] = { code = code, signal = signal }
  local ask = package.loaded['codectx.ask']
  if ask then
    ask.on_exit(client.id, code, signal)
  end
end

--- Sends `workspace/executeCommand` for a codectx command (one object argument or none).
---@param client vim.lsp.Client
---@param command string e.g. 'codectx.status'
---@param argument table? The command's object argument.
---@param on_result fun(err: lsp.ResponseError?, result: any)
---@param bufnr integer?
---@return boolean sent, integer? request_id
function M.execute(client, command, argument, on_result, bufnr)
  local params = { command = command, arguments = argument and { argument } or nil }
  return client:request('workspace/executeCommand', params, on_result, bufnr)
end

local function report_error(what, err)
  vim.notify(('codectx: %s failed: %s'):format(what, err.message or vim.inspect(err)), vim.log.levels.ERROR)
end

--- Lines summarizing a `codectx.status` result.
---@param status table
---@return string[]
function M.format_status(status)
  if not status.ready and type(status.loadError) == 'string' then
    return { 'codectx: the model did not load: ' .. status.loadError }
  end
  local lines = {
    ('codectx: %s, model %s'):format(status.ready and 'ready' or 'loading', status.model or '-'),
  }
  local warm = status.warmup
  if type(warm) == 'table' then
    lines[#lines + 1] = ('warm-up: %s, %d prefix tokens, %d runs'):format(
      warm.warm and 'warm' or (warm.running and 'running' or 'cold'), warm.prefixTokens or 0, warm.runs or 0)
  end
  local c = status.counters or {}
  lines[#lines + 1] = ('asks %d, hovers %d (%d from cache), cancelled %d'):format(
    c.asks or 0, c.hovers or 0, c.hoverCacheHits or 0, c.cancelled or 0)
  local m = status.lastMetrics
  if type(m) == 'table' and m.prompt_tokens then
    lines[#lines + 1] = ('last request: %d prompt tokens (%d cached), TTFT %.2f s, decode %.1f tok/s'):format(
      m.prompt_tokens or 0, m.cached_tokens or 0, m.ttft_s or 0, m.decode_tps or 0)
  end
  return lines
end

--- Runs `command` (with `argument`, optional) on the attached client and hands its result to
--- `on_result`; a missing client or an error is reported (as `what`) instead.
local function run_command(command, what, on_result, argument)
  local client = M.require_client()
  if not client then
    return
  end
  M.execute(client, command, argument, function(err, result)
    if err then
      return report_error(what, err)
    end
    on_result(result)
  end)
end

--- `:CodectxStatus`: asks the server for `codectx.status` and shows a summary.
function M.show_status()
  run_command('codectx.status', 'status', function(status)
    vim.notify(table.concat(M.format_status(status), '\n'), vim.log.levels.INFO)
  end)
end

local CONTEXT_BUFFER = 'codectx://context'

--- `:CodectxContext [question]`: the prefix layout (`codectx.showContext`) in a read-only
--- scratch buffer, reused on the next call; with a question, also the focus an ask would get.
---@param question string? Shows what this question would focus.
function M.show_context(question)
  local argument = (question and question ~= '') and { question = question } or nil
  run_command('codectx.showContext', 'show context', function(result)
    local buf = vim.fn.bufnr(CONTEXT_BUFFER)
    if buf == -1 then
      buf = vim.api.nvim_create_buf(true, true)
      vim.api.nvim_buf_set_name(buf, CONTEXT_BUFFER)
      vim.bo[buf].filetype = 'markdown'
    end
    vim.bo[buf].modifiable = true
    vim.api.nvim_buf_set_lines(buf, 0, -1, true, vim.split(result.markdown, '\n', { plain = true, trimempty = true }))
    vim.bo[buf].modifiable = false
    if vim.fn.bufwinid(buf) == -1 then
      vim.cmd.split()
      vim.api.nvim_win_set_buf(0, buf)
    end
  end, argument)
end

return M
