--- `:CodectxAsk`: a question to `codectx.ask`, its answer streamed into a floating window
--- from `codectx/stream` notifications. `q` or `<C-c>` in the window (or closing it any other
--- way) cancels a running answer with `$/cancelRequest` and closes the window.
local codectx = require('codectx')
local config = require('codectx.config')

local M = {}

---@class codectx.Answer
---@field client vim.lsp.Client
---@field request_id integer? JSON-RPC id of the `codectx.ask` request.
---@field buf integer The float's buffer.
---@field win integer The float.
---@field text string Streamed text so far.
---@field finish string? finishReason of the stream's end (`stop`, `length`, `repetition`, `cancelled`, `error`), or of an acknowledged cancel.
---@field result table? The request's result (`text`, `finishReason`, `metrics`, `conversationId`, `droppedTurns`).
---@field error lsp.ResponseError? The request's error (a cancelled request gets none: Neovim drops that reply).
---@field cancelled boolean? `$/cancelRequest` was sent.
---@field exited { code: integer, signal: integer }? The server exited before the answer ended (nothing more comes).

--- Answers whose stream has not ended yet, by "client id:request id".
---@type table<string, codectx.Answer>
M.streaming = {}

--- The most recent answer (also after its window closed).
---@type codectx.Answer?
M.last = nil

local group = vim.api.nvim_create_augroup('codectx.ask', { clear = true })

local function key(client_id, request_id)
  return ('%d:%s'):format(client_id, tostring(request_id))
end

local function size(value, total)
  return math.max(1, math.floor(value <= 1 and value * total or math.min(value, total)))
end

local function open_float(question)
  local opts = config.options.float
  local width, height = size(opts.width, vim.o.columns), size(opts.height, vim.o.lines - 2)
  local title = question:gsub('%s+', ' ')
  if vim.fn.strchars(title) > width - 4 then
    title = vim.fn.strcharpart(title, 0, width - 5) .. '…'
  end
  local buf = vim.api.nvim_create_buf(false, true)
  vim.bo[buf].bufhidden = 'wipe'
  vim.bo[buf].filetype = 'markdown'
  vim.bo[buf].modifiable = false
  local win = vim.api.nvim_open_win(buf, true, {
    relative = 'editor', width = width, height = height, style = 'minimal', border = opts.border,
    row = math.floor((vim.o.lines - height) / 2), col = math.floor((vim.o.columns - width) / 2),
    title = ' ' .. title .. ' ', title_pos = 'center', footer = ' answering… ', footer_pos = 'right',
  })
  vim.wo[win].wrap = true
  vim.wo[win].linebreak = true
  return buf, win
end

local function set_footer(answer, text)
  if vim.api.nvim_win_is_valid(answer.win) then
    vim.api.nvim_win_set_config(answer.win, { footer = ' ' .. text .. ' ', footer_pos = 'right' })
  end
end

--- Writes `text` at the end of the float's buffer: its first line continues the last line.
local function write(answer, text)
  local buf = answer.buf
  if not vim.api.nvim_buf_is_valid(buf) then
    return
  end
  local lines = vim.split(text, '\n', { plain = true })
  local last = vim.api.nvim_buf_line_count(buf)
  lines[1] = vim.api.nvim_buf_get_lines(buf, last - 1, last, true)[1] .. lines[1]
  vim.bo[buf].modifiable = true
  vim.api.nvim_buf_set_lines(buf, last - 1, last, true, lines)
  vim.bo[buf].modifiable = false
  if vim.api.nvim_win_is_valid(answer.win) then
    vim.api.nvim_win_set_cursor(answer.win, { vim.api.nvim_buf_line_count(buf), 0 })
  end
end

local function summary(result)
  local m = result.metrics or {}
  local dropped = (result.droppedTurns or 0) > 0
      and (' · %d earlier turns left out to fit the context'):format(result.droppedTurns) or ''
  return ('%s · %d tokens · %.1f tok/s · TTFT %.2f s%s'):format(
    result.finishReason or '?', m.decode_tokens or 0, m.decode_tps or 0, m.ttft_s or 0, dropped)
end

--- Handler of `codectx/stream` (registered in `lsp/codectx.lua`).
---@param params { requestId: integer, kind: string, index: integer, text: string, done: boolean, finishReason: string? }
---@param ctx lsp.HandlerContext
function M.on_stream(_, params, ctx)
  local id = key(ctx.client_id, params.requestId)
  local answer = M.streaming[id]
  if not answer then
    return
  end
  if params.done then
    answer.finish = params.finishReason
    M.streaming[id] = nil
  elseif params.text ~= '' then
    answer.text = answer.text .. params.text
    write(answer, params.text)
  end
end

local function on_result(answer, err, result)
  -- An error before the answer began has no stream, so nothing else ends this entry.
  M.streaming[key(answer.client.id, answer.request_id)] = nil
  if err then
    answer.error = err
    set_footer(answer, 'error')
    local message = 'codectx: ask failed: ' .. (err.message or vim.inspect(err))
    write(answer, (answer.text == '' and '' or '\n\n') .. message)
    vim.notify(message, vim.log.levels.ERROR)
    return
  end
  answer.result = result
  set_footer(answer, summary(result))
end

-- The reply to a cancelled request (-32800) never reaches its handler: Neovim drops it. When
-- the request was cancelled before its answer began (at once, or while the model loads), no
-- stream end follows either, so the reply itself, seen as an `LspRequest` "complete", ends the
-- entry. A result or error is handed to its handler right after that event, a -32800 never.
vim.api.nvim_create_autocmd('LspRequest', {
  group = group,
  callback = function(ev)
    local data = ev.data
    local id = key(data.client_id, data.request_id)
    local answer = M.streaming[id]
    if not answer or data.request.type ~= 'complete' then
      return
    end
    vim.schedule(function()
      if M.streaming[id] == answer and answer.result == nil and answer.error == nil then
        M.streaming[id] = nil
        answer.finish = answer.finish or 'cancelled'
      end
    end)
  end,
})

--- Ends the answers of a client whose server exited (`codectx.exited`): their footer says so.
---@param client_id integer
---@param code integer
---@param signal integer
function M.on_exit(client_id, code, signal)
  for id, answer in pairs(M.streaming) do
    if answer.client.id == client_id then
      M.streaming[id] = nil
      answer.exited = { code = code, signal = signal }
      set_footer(answer, 'server exited')
      write(answer, ('%scodectx: the language server exited (%s) before the answer finished'):format(
        answer.text == '' and '' or '\n\n', codectx.describe_exit(code, signal)))
    end
  end
end

--- Cancels `answer`'s request (once) if the answer is still streaming.
---@param answer codectx.Answer
function M.cancel(answer)
  if not answer.cancelled and answer.request_id and M.streaming[key(answer.client.id, answer.request_id)] then
    answer.cancelled = true
    answer.client:cancel_request(answer.request_id)
  end
end

--- Stops `answer`: cancels it if it is still streaming and closes its window.
---@param answer codectx.Answer
function M.stop(answer)
  M.cancel(answer)
  if vim.api.nvim_win_is_valid(answer.win) then
    vim.api.nvim_win_close(answer.win, true)
  end
end

--- The whole lines `first`..`last` (1-based) of `bufnr` as an LSP selection.
local function line_selection(bufnr, first, last, encoding)
  local text = vim.api.nvim_buf_get_lines(bufnr, last - 1, last, true)[1]
  return {
    uri = vim.uri_from_bufnr(bufnr),
    range = {
      start = { line = first - 1, character = 0 },
      ['end'] = { line = last - 1, character = vim.str_utfindex(text, encoding) },
    },
  }
end

---@class codectx.Selection
---@field uri string
---@field range lsp.Range In the client's position encoding.

--- Asks `question`, streaming the answer into a new floating window.
---@param question string
---@param selection codectx.Selection? Code the question is about.
---@param client vim.lsp.Client? Defaults to the current buffer's codectx client.
---@return codectx.Answer?
function M.ask(question, selection, client)
  local bufnr = vim.api.nvim_get_current_buf()
  client = client or codectx.require_client(bufnr)
  if not client then
    return nil
  end
  local argument = { question = question, maxTokens = config.options.max_tokens }
  if selection then
    argument.uri, argument.range = selection.uri, selection.range
  end
  local answer = { client = client, text = '' }
  answer.buf, answer.win = open_float(question)
  local sent, request_id = codectx.execute(client, 'codectx.ask', argument, function(err, result)
    on_result(answer, err, result)
  end, bufnr)
  if not sent then
    M.stop(answer)
    vim.notify('codectx: the language server is not running', vim.log.levels.ERROR)
    return nil
  end
  answer.request_id = request_id
  M.streaming[key(client.id, request_id)] = answer
  M.last = answer
  for _, lhs in ipairs({ 'q', '<C-c>' }) do
    vim.keymap.set('n', lhs, function()
      M.stop(answer)
    end, { buffer = answer.buf, nowait = true, desc = 'codectx: stop and close' })
  end
  vim.api.nvim_create_autocmd('WinClosed', {
    group = group, pattern = tostring(answer.win), once = true,
    callback = function()
      M.cancel(answer)
    end,
  })
  return answer
end

local function prompt(on_question)
  vim.ui.input({ prompt = 'Ask codectx: ' }, function(question)
    if question and question:match('%S') then
      on_question(question)
    end
  end)
end

--- `:[range]CodectxAsk [question]`: asks about the repository, or about the lines of a range;
--- prompts for the question when none is given. A range needs a buffer of a file.
---@param cmd vim.api.keyset.create_user_command.command_args
function M.command(cmd)
  local bufnr = vim.api.nvim_get_current_buf()
  if cmd.range > 0 and not codectx.is_file(bufnr) then
    local name = vim.api.nvim_buf_get_name(bufnr)
    vim.notify(('codectx: cannot ask about lines of %s: it is no file; write it to a file of the repository, or '
      .. 'ask without a range'):format(name == '' and 'an unnamed buffer' or name), vim.log.levels.ERROR)
    return
  end
  local client = codectx.require_client(bufnr)
  if not client then
    return
  end
  local selection = cmd.range > 0 and line_selection(bufnr, cmd.line1, cmd.line2, client.offset_encoding) or nil
  if cmd.args ~= '' then
    M.ask(cmd.args, selection, client)
  else
    prompt(function(question)
      M.ask(question, selection, client)
    end)
  end
end

--- Client side of the commands that codectx code actions resolve to (`vim.lsp.commands`):
--- `codectx.ask` ("Explain selection") and `codectx.askAboutSelection` (prompts for the
--- question) both answer in the float.
---@param command lsp.Command
---@param ctx { client_id: integer, bufnr: integer }
function M.run_command(command, ctx)
  local argument = (command.arguments or {})[1] or {}
  local client = vim.lsp.get_client_by_id(ctx.client_id)
  local selection = argument.uri and argument.range and { uri = argument.uri, range = argument.range } or nil
  if command.command == 'codectx.askAboutSelection' then
    prompt(function(question)
      M.ask(question, selection, client)
    end)
  else
    M.ask(argument.question or '', selection, client)
  end
end

return M
