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

--- The codectx client attached to `bufnr`, else any running codectx client.
---@param bufnr integer? Defaults to the current buffer.
---@return vim.lsp.Client?
function M.client(bufnr)
  local clients = vim.lsp.get_clients({ name = M.name, bufnr = bufnr or 0 })
  if #clients == 0 then
    clients = vim.lsp.get_clients({ name = M.name })
  end
  return clients[1]
end

--- Like `client`, but tells the user how to start one when there is none.
---@param bufnr integer?
---@return vim.lsp.Client?
function M.require_client(bufnr)
  local client = M.client(bufnr)
  if not client then
    vim.notify(
      "codectx: no language server running; add vim.lsp.enable('codectx') to your config and open a file of the repository",
      vim.log.levels.ERROR
    )
  end
  return client
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
