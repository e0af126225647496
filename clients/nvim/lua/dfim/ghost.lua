-- Inline completion with our own ghost text (extmarks), for Neovim < 0.12 or `native = false`.
--
-- One suggestion state per buffer. A request goes out on entering insert mode and when typing or cursor moves
-- in insert mode settle (debounce); an answer that arrives after the buffer or cursor moved on is dropped.
-- Accept inserts the rest of the suggestion and runs the item's command (the server records the accept);
-- accept word/line insert a part, tell the server (`dfim/inlinePartiallyAccepted`) and keep showing the rest;
-- dismiss tells it `dfim/inlineRejected`.
local compat = require('dfim.compat')

local M = {}
local ns = vim.api.nvim_create_namespace('dfim_ghost')
local ACCEPT_COMMAND = 'dfim.inlineAccepted'

M.states = {} -- bufnr -> state
M.config = { debounce_ms = 75, hl_group = 'DfimGhost' }

local function get_client(bufnr)
  local dfim = require('dfim')
  return dfim.client_for(bufnr)
end

local function cursor()
  local pos = vim.api.nvim_win_get_cursor(0)
  return pos[1] - 1, pos[2]
end

local function clear_mark(bufnr)
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, ns, 0, -1)
  end
end

--- The suggestion id an item carries: the first argument of its accept command.
local function item_id(item)
  local cmd = item.command
  if type(cmd) == 'table' and cmd.command == ACCEPT_COMMAND and type(cmd.arguments) == 'table' then
    return cmd.arguments[1]
  end
end

--- An LSP item as what to insert at the cursor: {text, end_col, id, command}, or nil if it cannot be shown
--- as ghost text here (a range off the cursor line, or one that rewrites what is before the cursor).
function M.normalize(bufnr, item, row, col, encoding)
  local insert = item.insertText
  if type(insert) == 'table' then
    insert = insert.value -- a snippet: shown and inserted as plain text
  end
  if type(insert) ~= 'string' or insert == '' then
    return nil
  end
  -- The server answers a CRLF document (fileformat=dos) with \r\n line breaks; the buffer's lines carry none.
  insert = insert:gsub('\r\n', '\n'):gsub('\r', '\n')
  local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  local start_col, end_col = col, col
  if item.range then
    if item.range.start.line ~= row or item.range['end'].line ~= row then
      return nil
    end
    start_col = compat.byte_col(bufnr, item.range.start, encoding)
    end_col = compat.byte_col(bufnr, item.range['end'], encoding)
  end
  if start_col > col or end_col < col then
    return nil
  end
  local typed = line:sub(start_col + 1, col)
  if insert:sub(1, #typed) ~= typed then
    return nil
  end
  local text = insert:sub(#typed + 1)
  if text == '' then
    return nil
  end
  return { text = text, end_col = end_col, id = item_id(item), command = item.command, raw = item }
end

local function render(bufnr, st)
  clear_mark(bufnr)
  local cand = st.items[st.index]
  if not cand then
    return
  end
  local lines = vim.split(cand.text, '\n', { plain = true })
  local hl = M.config.hl_group
  local first = { { lines[1], hl } }
  if #st.items > 1 then
    table.insert(first, { string.format(' (%d/%d)', st.index, #st.items), 'Comment' })
  end
  local virt_lines = {}
  for i = 2, #lines do
    table.insert(virt_lines, { { lines[i], hl } })
  end
  local line = vim.api.nvim_buf_get_lines(bufnr, st.row, st.row + 1, false)[1] or ''
  local pos
  if compat.has('0.10') then
    pos = 'inline'
  elseif st.col >= #line then
    pos = 'overlay'
  else
    pos = 'eol' -- mid-line on an old Neovim: no inline virtual text; show it after the line
  end
  local opts = { virt_text = first, virt_text_pos = pos, hl_mode = 'combine' }
  if #virt_lines > 0 then
    opts.virt_lines = virt_lines
  end
  st.extmark = vim.api.nvim_buf_set_extmark(bufnr, ns, st.row, math.min(st.col, #line), opts)
end

local function notify(bufnr, method, params)
  local client = get_client(bufnr)
  if client then
    pcall(compat.notify, client, method, params)
  end
end

--- Forget the suggestion of `bufnr`; `reason` 'rejected' tells the server it was dismissed.
function M.clear(bufnr, reason)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  local st = M.states[bufnr]
  M.states[bufnr] = nil
  clear_mark(bufnr)
  if st and st.items[st.index] and reason == 'rejected' and st.accepted == 0 then
    local id = st.items[st.index].id
    if id then
      notify(bufnr, 'dfim/inlineRejected', { id = id })
    end
  end
end

function M.visible(bufnr)
  local st = M.states[bufnr or vim.api.nvim_get_current_buf()]
  return st ~= nil and st.items[st.index] ~= nil
end

function M.current(bufnr)
  local st = M.states[bufnr or vim.api.nvim_get_current_buf()]
  return st and st.items[st.index]
end

local pending = {} -- bufnr -> {client, id}
M.pending = pending -- for tests: empty once every answer came back

--- An asked-for suggestion that did not come: said in the command line, not in the message history.
function M.say_empty()
  vim.api.nvim_echo({ { 'dfim: no suggestion here', 'Comment' } }, false, {})
end

--- Ask the server now. `invoked` marks a manual trigger (InlineCompletionTriggerKind.Invoked = 1).
--- on_done(got, err, why): why is 'empty' when the server answered with nothing to show.
function M.request(bufnr, invoked, on_done)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  local client = get_client(bufnr)
  -- Not before `initialize` is answered (0.7 would send it at once, and the server does not know the
  -- buffer yet): the request goes out when the status turns ready (init.lua's `ask_when_ready`).
  if not client or not client.initialized then
    if on_done then on_done(false) end
    return
  end
  local prev = pending[bufnr]
  if prev then
    pcall(compat.cancel, prev.client, prev.id)
    pending[bufnr] = nil
  end
  local row, col = cursor()
  local tick = vim.api.nvim_buf_get_changedtick(bufnr)
  local encoding = client.offset_encoding or 'utf-16'
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(bufnr) },
    position = { line = row, character = compat.character(bufnr, row, col, encoding) },
    context = { triggerKind = invoked and 1 or 2 },
  }
  local ok, id -- declared first: the handler below compares its request id with this one
  ok, id = compat.request(client, 'textDocument/inlineCompletion', params, function(err, result)
    if pending[bufnr] and pending[bufnr].id == id then
      pending[bufnr] = nil
    end
    local r, c = cursor()
    local stale = not vim.api.nvim_buf_is_valid(bufnr)
      or vim.api.nvim_get_current_buf() ~= bufnr
      or vim.api.nvim_buf_get_changedtick(bufnr) ~= tick
      or r ~= row
      or c ~= col
    if err or stale then
      if on_done then on_done(false, err) end
      return
    end
    if not result then
      if invoked then
        M.clear(bufnr) -- asked for, and nothing here: an older suggestion is not the answer either
      end
      if on_done then on_done(false, nil, 'empty') end
      return
    end
    local items = {}
    for _, item in ipairs(result.items or result) do
      local cand = M.normalize(bufnr, item, row, col, encoding)
      if cand then
        table.insert(items, cand)
      end
    end
    if #items == 0 then
      M.clear(bufnr)
      if on_done then on_done(false, nil, 'empty') end
      return
    end
    local old = M.states[bufnr]
    local keep = old and old.items[old.index] and old.items[old.index].id == items[1].id
    M.states[bufnr] = {
      items = items,
      index = 1,
      row = row,
      col = col,
      client_id = client.id,
      accepted = keep and old.accepted or 0,
      invoked = invoked, -- alternatives asked for: next/previous step through these without asking again
    }
    render(bufnr, M.states[bufnr])
    if on_done then on_done(true) end
  end, bufnr)
  if ok then
    pending[bufnr] = { client = client, id = id }
  elseif on_done then
    on_done(false)
  end
end

local timers = {}

--- Debounced request after typing.
function M.schedule(bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  if timers[bufnr] then
    timers[bufnr]:stop()
    timers[bufnr]:close()
  end
  local timer = compat.uv.new_timer()
  timers[bufnr] = timer
  timer:start(M.config.debounce_ms, 0, vim.schedule_wrap(function()
    if timers[bufnr] == timer then
      timers[bufnr] = nil
      timer:close()
    end
    if vim.api.nvim_get_current_buf() == bufnr and vim.fn.mode():sub(1, 1) == 'i' then
      M.request(bufnr, false)
    end
  end))
end

--- Insert `text` at the suggestion's position; with `finish`, also replace up to the item's range end.
local function insert(bufnr, st, text, finish)
  local cand = st.items[st.index]
  local end_col = finish and math.max(cand.end_col, st.col) or st.col
  local lines = vim.split(text, '\n', { plain = true })
  vim.api.nvim_buf_set_text(bufnr, st.row, st.col, st.row, end_col, lines)
  local row = st.row + #lines - 1
  local col = (#lines == 1 and st.col or 0) + #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { row + 1, col })
  return row, col
end

--- Accept all of the suggestion. Returns false when there is none (so a <Tab> mapping can fall back).
function M.accept(bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  local st = M.states[bufnr]
  local cand = st and st.items[st.index]
  if not cand then
    return false
  end
  M.states[bufnr] = nil
  clear_mark(bufnr)
  insert(bufnr, st, cand.text, true)
  local client = get_client(bufnr)
  if client and cand.command then
    pcall(compat.request, client, 'workspace/executeCommand', {
      command = cand.command.command,
      arguments = cand.command.arguments,
    }, function() end, bufnr)
  end
  return true
end

--- The next word (`kind` = 'word') or the rest of the line ('line') of a suggestion's text.
function M.split_part(text, kind)
  if kind == 'line' then
    local part = text:match('^\n?[^\n]*')
    if part == '' then part = text:match('^\n') or '' end
    return part
  end
  return text:match('^%s*[%w_]+') or text:match('^%s*[^%w_%s]+') or text:match('^%s+') or text
end

--- Accept the next word or line; the rest stays on screen.
function M.accept_part(kind, bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  local st = M.states[bufnr]
  local cand = st and st.items[st.index]
  if not cand then
    return false
  end
  local part = M.split_part(cand.text, kind)
  if part == '' or part == cand.text then
    return M.accept(bufnr)
  end
  local old_col = st.col
  local row, col = insert(bufnr, st, part, false)
  st.accepted = st.accepted + compat.strchars(part)
  st.row, st.col = row, col
  cand.text = cand.text:sub(#part + 1)
  -- What lay after the cursor moved along with it, the part of it the item's range replaces too: the range
  -- end keeps its distance from the cursor (on the new line when the part ended in a line break).
  cand.end_col = col + math.max(cand.end_col - old_col, 0)
  st.items = { cand }
  st.index = 1
  st.invoked = nil -- one item left: the next <M-]> asks for alternatives at the new cursor
  st.own_tick = vim.api.nvim_buf_get_changedtick(bufnr)
  if cand.id then
    notify(bufnr, 'dfim/inlinePartiallyAccepted', { id = cand.id, acceptedLength = st.accepted })
  end
  render(bufnr, st)
  return true
end

--- Next (`delta` 1) or previous (-1) suggestion. What an automatic request showed is one suggestion (or
--- `inline.candidates`), not a choice: the first step asks the server for alternatives (triggerKind
--- Invoked, several distinct candidates) and shows the one after (or before) the one on screen, which stays
--- in the cycle; further steps go through that list without asking again.
function M.cycle(delta, bufnr, on_done)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  local st = M.states[bufnr]
  if st and st.invoked and #st.items > 0 then
    st.index = (st.index - 1 + delta) % #st.items + 1
    render(bufnr, st)
    if on_done then on_done(true) end
    return
  end
  local was = st and st.items[st.index]
  M.request(bufnr, true, function(got, err, why)
    local now = M.states[bufnr]
    if why == 'empty' and not was then
      M.say_empty()
    end
    if got and now and was then
      local at -- where the suggestion that was on screen is among the alternatives
      for i, cand in ipairs(now.items) do
        if cand.text == was.text then
          at = i
        end
      end
      if not at then
        table.insert(now.items, 1, was)
        at = 1
      end
      now.index = (at - 1 + delta) % #now.items + 1
      render(bufnr, now)
    end
    if on_done then on_done(got, err) end
  end)
end

--- Autocommands for one buffer: request (debounced) on entering insert mode, after typing and when the cursor
--- moves in insert mode, as Neovim 0.12's built-in client does; clear when the cursor leaves the suggestion.
function M.attach(bufnr)
  local group = vim.api.nvim_create_augroup('dfim_ghost_' .. bufnr, { clear = true })
  vim.api.nvim_create_autocmd('InsertEnter', {
    group = group,
    buffer = bufnr,
    callback = function()
      if require('dfim').enabled() then
        M.schedule(bufnr)
      end
    end,
  })
  vim.api.nvim_create_autocmd('TextChangedI', {
    group = group,
    buffer = bufnr,
    callback = function()
      local st = M.states[bufnr]
      if st and st.own_tick == vim.api.nvim_buf_get_changedtick(bufnr) then
        return -- our own partial accept: the rest is already shown
      end
      if not require('dfim').enabled() then
        return
      end
      M.schedule(bufnr)
    end,
  })
  vim.api.nvim_create_autocmd('CursorMovedI', {
    group = group,
    buffer = bufnr,
    callback = function()
      local st = M.states[bufnr]
      local r, c = cursor()
      if st and r == st.row and c == st.col then
        return -- still at the suggestion (a partial accept moves it along with the cursor)
      end
      if st then
        M.clear(bufnr, 'rejected')
      end
      if require('dfim').enabled() then
        M.schedule(bufnr) -- typing moves the cursor too: one debounced request for both events
      end
    end,
  })
  vim.api.nvim_create_autocmd({ 'InsertLeave', 'BufLeave' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.clear(bufnr, 'rejected')
    end,
  })
end

function M.detach(bufnr)
  pcall(vim.api.nvim_del_augroup_by_name, 'dfim_ghost_' .. bufnr)
  M.clear(bufnr)
end

return M
