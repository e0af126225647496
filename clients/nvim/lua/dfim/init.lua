-- dfim for Neovim: starts `dfim serve`, shows inline completions (vim.lsp.inline_completion on 0.12+, our
-- own ghost text before), keymaps for accept / word / line / next / previous / dismiss, :DfimStats,
-- :DfimToggle, :DfimRewrite, :DfimRestart. Code actions come through the normal LSP menu
-- (vim.lsp.buf.code_action(); on 0.7, vim.lsp.buf.range_code_action() for a selection). :checkhealth dfim
-- is lua/dfim/health.lua.
local compat = require('dfim.compat')
local ghost = require('dfim.ghost')

local M = {}

M.defaults = {
  cmd = { 'dfim', 'serve' }, -- e.g. { vim.fn.expand('~/dfim/.venv/bin/dfim'), 'serve' }
  filetypes = nil, -- nil = every normal buffer; else a list of filetypes
  root_markers = { '.git', 'pyproject.toml', 'package.json', 'go.mod', 'Cargo.toml' },
  settings = {}, -- the server's settings tree, e.g. { sampling = { maxSteps = 8 } } (docs/editors.md)
  native = nil, -- nil = vim.lsp.inline_completion when Neovim has it (0.12+); false = always our ghost text
  debounce_ms = 75,
  keymaps = {
    accept = '<Tab>', -- nothing shown: does what the key did before (another plugin's mapping, or a plain Tab)
    accept_word = '<M-Right>',
    accept_line = '<M-C-Right>',
    next = '<M-]>',
    prev = '<M-[>',
    dismiss = '<C-]>',
  },
}

M.config = vim.deepcopy(M.defaults)
M.status = {} -- the last dfim/status params
M.client_id = nil
local is_enabled = true

-- Starting and restarting. A server that cannot start (no executable, a spawn error) or keeps exiting is
-- not started again on every BufEnter: the failure is reported once and remembered until :DfimRestart.
M.MAX_RESTARTS = 2 -- restarts after unexpected exits before giving up
local HEALTHY_MS = 60000 -- a server that ran this long before exiting starts a fresh count
M.failure = nil -- why the server is not started automatically any more (nil: it is)
local crashes = 0
local clients = {} -- client id -> { started = ms, initialized = bool, stopping = bool, buffers = {bufnr = true} }
local leaving = false

local function use_native()
  if M.config.native == false then
    return false
  end
  return vim.lsp.inline_completion ~= nil and vim.lsp.inline_completion.enable ~= nil
end

function M.enabled()
  return is_enabled
end

function M.client_for(bufnr)
  if not M.client_id then
    return nil
  end
  local client = vim.lsp.get_client_by_id(M.client_id)
  if client and bufnr and not vim.lsp.buf_is_attached(bufnr, client.id) then
    return nil
  end
  return client
end

--- One line for a statusline: `dfim 84ms 6 steps`, `dfim …` while busy, `dfim !` on error; `hidden` after it
--- when the confidence gate hid the last suggestion (the server answered and chose silence; <M-]> asks anyway).
function M.statusline()
  local s = M.status
  if not M.client_id then
    return ''
  end
  if not is_enabled then
    return 'dfim off'
  end
  if s.state == 'loading' then
    return 'dfim loading'
  elseif s.state == 'busy' then
    return 'dfim …'
  elseif s.state == 'error' then
    return 'dfim !'
  end
  if type(s.lastLatencyMs) == 'number' then
    local steps = s.lastSteps == 1 and '1 step' or (tostring(s.lastSteps or '?') .. ' steps')
    local hidden = type(s.lastHidden) == 'string' and ' hidden' or ''
    return string.format('dfim %dms %s%s', math.floor(s.lastLatencyMs + 0.5), steps, hidden)
  end
  return 'dfim'
end

--- The workspace root for `bufnr`: the folder holding the first of `markers` (default: the configured
--- root_markers) found upwards from the buffer's file, else the file's folder.
function M.root_dir(bufnr, markers)
  local name = vim.api.nvim_buf_get_name(bufnr)
  local dir = name ~= '' and vim.fn.fnamemodify(name, ':p:h') or compat.uv.cwd()
  for _, marker in ipairs(markers or M.config.root_markers) do
    local found = vim.fn.finddir(marker, dir .. ';')
    if found == '' then
      found = vim.fn.findfile(marker, dir .. ';')
    end
    if found ~= '' then
      -- :p gives a folder a trailing slash, a file none: drop it, then :h is the folder that holds the marker
      local path = vim.fn.fnamemodify(found, ':p'):gsub('/+$', '')
      return vim.fn.fnamemodify(path, ':h')
    end
  end
  return dir
end

local function wanted(bufnr)
  if not vim.api.nvim_buf_is_valid(bufnr) or not vim.api.nvim_buf_is_loaded(bufnr) then
    return false
  end
  if vim.bo[bufnr].buftype ~= '' then
    return false
  end
  -- No name ([No Name], :enew): every such buffer would be the same URI `file://` on the server. It is
  -- attached once it gets a name (BufFilePost, BufWritePost).
  if vim.api.nvim_buf_get_name(bufnr) == '' then
    return false
  end
  local fts = M.config.filetypes
  if not fts then
    return true
  end
  return vim.tbl_contains(fts, vim.bo[bufnr].filetype)
end

local ACCEPT_DESC = 'dfim: accept the suggestion'
M.FALLBACK = '<Plug>(dfim-accept-fallback)'

--- Keep what the accept key did before dfim mapped it in this buffer (a buffer-local or global mapping,
--- e.g. nvim-cmp's or luasnip's <Tab>, or nothing) as the buffer-local <Plug>(dfim-accept-fallback), which
--- the accept mapping returns when no suggestion is shown. A copy with the same attributes (expr, noremap,
--- silent, nowait, script, Lua callback), so an expr mapping is evaluated as before and a recursive one
--- is still remapped; no mapping: the key itself, not remapped.
local function save_fallback(bufnr, lhs)
  local prev, have -- maparg sees the current buffer's mappings; upvalues keep a Lua callback intact
  vim.api.nvim_buf_call(bufnr, function()
    prev = vim.fn.maparg(lhs, 'i', false, true)
    have = vim.fn.maparg(M.FALLBACK, 'i') ~= ''
  end)
  if type(prev) == 'table' and prev.desc == ACCEPT_DESC then
    if have then
      return -- attached again (a restart): our own mapping is not what came before it
    end
    prev = {}
  end
  local rhs, opts = lhs, { noremap = true, desc = 'dfim: ' .. lhs .. ' as it was before dfim' }
  if type(prev) == 'table' and next(prev) ~= nil then
    rhs = prev.rhs or ''
    opts.noremap = prev.noremap == 1
    opts.expr = prev.expr == 1
    opts.silent = prev.silent == 1
    opts.nowait = prev.nowait == 1
    opts.script = prev.script == 1
    opts.callback = prev.callback
    if prev.callback ~= nil and type(prev.callback) ~= 'function' then
      -- 0.7's maparg() gives a Lua callback as a number; nvim_(buf_)get_keymap gives the function
      local maps = prev.buffer == 1 and vim.api.nvim_buf_get_keymap(bufnr, 'i') or vim.api.nvim_get_keymap('i')
      opts.callback = nil
      for _, m in ipairs(maps) do
        if m.lhs == prev.lhs and type(m.callback) == 'function' then
          opts.callback = m.callback
        end
      end
    end
    if opts.expr and compat.has('0.8') then
      opts.replace_keycodes = prev.replace_keycodes == 1
    end
  end
  vim.api.nvim_buf_set_keymap(bufnr, 'i', M.FALLBACK, rhs, opts)
end

local function map_keys(bufnr)
  local k = M.config.keymaps
  local function map(lhs, fn, desc, expr, remap)
    if lhs and lhs ~= '' then
      vim.keymap.set('i', lhs, fn, { buffer = bufnr, desc = desc, expr = expr, remap = remap, silent = true })
    end
  end
  if k.accept and k.accept ~= '' then
    save_fallback(bufnr, k.accept)
  end
  -- remap: the returned <Plug> must expand (nothing else returned here is a mapped key)
  map(k.accept, function()
    if use_native() then
      -- get() accepts what is shown and says so; nothing shown: the key does what it did before
      return vim.lsp.inline_completion.get() and '' or M.FALLBACK
    end
    if ghost.visible() then
      return '<Cmd>lua require("dfim").accept()<CR>' -- an expr mapping may not edit the buffer itself
    end
    return M.FALLBACK
  end, ACCEPT_DESC, true, true)
  map(k.accept_word, function() M.accept_word() end, 'dfim: accept the next word')
  map(k.accept_line, function() M.accept_line() end, 'dfim: accept the next line')
  map(k.next, function() M.next() end, 'dfim: next suggestion')
  map(k.prev, function() M.prev() end, 'dfim: previous suggestion')
  map(k.dismiss, function() M.dismiss() end, 'dfim: dismiss the suggestion')
end

local function on_attach(client, bufnr)
  if use_native() then
    vim.lsp.inline_completion.enable(is_enabled, { bufnr = bufnr })
  else
    ghost.attach(bufnr)
  end
  map_keys(bufnr)
end

local LIST_KEYS = { languages = true } -- the settings tree's only list

--- `settings` as the server expects them: objects. An empty Lua table is encoded as the JSON array [];
--- vim.empty_dict() is {} (so `settings = {}`, the default, goes out as {}, not []).
function M.json_settings(value, key)
  if type(value) ~= 'table' or LIST_KEYS[key] then
    return value
  end
  if next(value) == nil then
    return vim.empty_dict()
  end
  if compat.islist(value) then
    return value
  end
  local out = {}
  for k, v in pairs(value) do
    out[k] = M.json_settings(v, k)
  end
  return out
end

local function cmd_text()
  local cmd = M.config.cmd
  return type(cmd) == 'table' and table.concat(cmd, ' ') or tostring(cmd)
end

--- Stop starting the server by itself, and say so once.
local function give_up(why)
  M.failure = why
  vim.notify(string.format('dfim: %s. Not starting it again; fix it (the `cmd` in setup(), docs/editors.md), '
    .. 'then run :DfimRestart.', why), vim.log.levels.ERROR)
end

local attach_all

--- A client of ours exited (called in a fast event on 0.7: nothing but plain Lua here, the rest scheduled).
local function on_exit(code, signal, client_id)
  local info = clients[client_id] or {}
  clients[client_id] = nil
  if M.client_id == client_id then
    M.client_id = nil
  end
  vim.schedule(function()
    for bufnr in pairs(info.buffers or {}) do
      ghost.clear(bufnr)
    end
    if info.stopping or leaving then
      return -- :DfimRestart, or Neovim quitting
    end
    code, signal = code or 0, signal or 0
    -- A clean stop (:LspStop: shutdown, exit 0) is no crash: the next buffer starts it again.
    if info.initialized and code == 0 and (signal == 0 or signal == 15) then
      return
    end
    if info.started and compat.uv.now() - info.started > HEALTHY_MS then
      crashes = 0 -- it ran a good while: not a server that cannot start
    end
    crashes = crashes + 1
    local how = string.format('exit code %d%s', code, signal ~= 0 and (', signal ' .. signal) or '')
    if crashes > M.MAX_RESTARTS then
      give_up(string.format('the server (%s) exited %d times in a row (%s%s)', cmd_text(), crashes, how,
        info.initialized and '' or ', before it finished starting'))
      return
    end
    -- restart it for the buffers it had (after a moment; give_up above ends a server that cannot run)
    vim.defer_fn(function()
      if not M.failure and not M.client_for(nil) then
        attach_all(info.buffers)
      end
    end, 300)
  end)
end

--- Start the server for `bufnr`. Returns the client id, or nil and why not.
local function start(bufnr)
  local cmd = M.config.cmd
  if type(cmd) == 'table' and type(cmd[1]) == 'string' and vim.fn.executable(cmd[1]) ~= 1 then
    return nil, string.format('cannot start the server: `%s` is not an executable file (not installed, or not '
      .. "on Neovim's PATH: give its full path, e.g. ~/dfim/.venv/bin/dfim expanded)", cmd[1])
  end
  local config = {
    name = 'dfim',
    cmd = cmd,
    root_dir = M.root_dir(bufnr),
    init_options = M.json_settings(M.config.settings),
    settings = { dfim = M.json_settings(M.config.settings) }, -- answers workspace/configuration "dfim"
    handlers = {
      ['dfim/status'] = function(_, result)
        local was = M.status.state
        M.status = result or {}
        vim.cmd('redrawstatus')
        if M.status.state == 'ready' and was ~= 'ready' and was ~= 'busy' then
          M.ask_when_ready()
        end
      end,
    },
    on_init = function(client)
      if clients[client.id] then
        clients[client.id].initialized = true
      end
    end,
    on_attach = on_attach,
    on_exit = on_exit,
  }
  local ok, id = pcall(compat.start_client, config, bufnr)
  if not ok then
    return nil, string.format('cannot start the server (%s): %s', cmd_text(), tostring(id))
  end
  if not id then
    return nil, string.format('cannot start the server (%s); :messages may say why', cmd_text())
  end
  return id
end

--- Start the server if needed and attach `bufnr` to it.
function M.attach(bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  if leaving or not wanted(bufnr) then
    return
  end
  if not M.client_for(nil) then
    if M.failure then
      return -- said once already; :DfimRestart clears it
    end
    local id, why = start(bufnr)
    if not id then
      give_up(why)
      return
    end
    M.client_id = id
    clients[id] = clients[id] or {}
    clients[id].started = compat.uv.now()
    clients[id].buffers = {}
  end
  local info = clients[M.client_id]
  if info then
    info.buffers[bufnr] = true
  end
  if not vim.lsp.buf_is_attached(bufnr, M.client_id) then
    vim.lsp.buf_attach_client(bufnr, M.client_id)
  end
end

--- Attach the buffers in the set `only` (nil: every loaded, listed buffer), the current one first.
attach_all = function(only)
  local current = vim.api.nvim_get_current_buf()
  local bufs = { current }
  for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do
    if bufnr ~= current and vim.api.nvim_buf_is_loaded(bufnr) and vim.bo[bufnr].buflisted then
      table.insert(bufs, bufnr)
    end
  end
  for _, bufnr in ipairs(bufs) do
    if (not only or only[bufnr]) and not M.failure then
      M.attach(bufnr)
    end
  end
end

--- :DfimRestart: stop the server if it runs, forget an earlier failure, start it again for the open buffers.
function M.restart()
  M.failure = nil
  crashes = 0
  local old = M.client_id and vim.lsp.get_client_by_id(M.client_id)
  M.client_id = nil
  if old then
    if clients[old.id] then
      clients[old.id].stopping = true
    end
    pcall(compat.stop, old)
  end
  for bufnr in pairs(ghost.states) do
    ghost.clear(bufnr)
  end
  attach_all(nil)
  if not M.failure and not M.client_id then
    vim.notify('dfim: no buffer to start the server for (open a file)', vim.log.levels.WARN)
  end
end

function M.visible()
  return not use_native() and ghost.visible()
end

function M.accept()
  if use_native() then
    return vim.lsp.inline_completion.get()
  end
  return ghost.accept()
end

function M.accept_word()
  if use_native() then
    return vim.lsp.inline_completion.get() -- the native API has no partial accept: take all of it
  end
  return ghost.accept_part('word')
end

function M.accept_line()
  if use_native() then
    return vim.lsp.inline_completion.get()
  end
  return ghost.accept_part('line')
end

function M.next()
  if use_native() then
    local select = vim.lsp.inline_completion.select or vim.lsp.inline_completion.jump
    return select({ count = 1 })
  end
  return ghost.cycle(1)
end

function M.prev()
  if use_native() then
    local select = vim.lsp.inline_completion.select or vim.lsp.inline_completion.jump
    return select({ count = -1 })
  end
  return ghost.cycle(-1)
end

function M.dismiss()
  if use_native() then
    local bufnr = vim.api.nvim_get_current_buf()
    vim.lsp.inline_completion.enable(false, { bufnr = bufnr }) -- clears what is shown
    vim.lsp.inline_completion.enable(is_enabled, { bufnr = bufnr })
    return
  end
  ghost.clear(nil, 'rejected')
end

--- The model just became ready: ask again at the cursor if insert mode is on in an attached buffer and nothing
--- is shown or asked yet. A request made during the load is held by the server and answered once the model is
--- ready (or empty after `inline.waitForModelMs`), and one made before `initialize` was answered was never
--- sent; either way the first keystroke of a session still gets its suggestion. Built-in client (0.12):
--- the server's wait covers it.
function M.ask_when_ready()
  local bufnr = vim.api.nvim_get_current_buf()
  if use_native() or not is_enabled or not M.client_for(bufnr) or vim.fn.mode():sub(1, 1) ~= 'i' then
    return
  end
  if not ghost.visible(bufnr) and not ghost.pending[bufnr] then
    ghost.request(bufnr, false)
  end
end

--- `message` with one `dfim: ` in front: the server's own messages already start with it.
function M.prefixed(message)
  message = tostring(message)
  return message:match('^dfim: ') and message or ('dfim: ' .. message)
end

--- Ask for a completion at the cursor now (ghost text mode), e.g. from a mapping or a test.
function M.trigger(on_done)
  ghost.request(nil, true, on_done or function(_, _, why)
    if why == 'empty' then
      ghost.say_empty()
    end
  end)
end

function M.toggle()
  is_enabled = not is_enabled
  if not is_enabled then
    for bufnr in pairs(ghost.states) do
      ghost.clear(bufnr)
    end
  end
  if use_native() then
    vim.lsp.inline_completion.enable(is_enabled)
  end
  vim.notify('dfim: inline completions ' .. (is_enabled and 'on' or 'off'))
end

--- Format dfim/stats (server/app.py) as lines.
function M.format_stats(stats)
  local lines = {}
  local keys = vim.tbl_keys(stats)
  table.sort(keys)
  for _, key in ipairs(keys) do
    local value = stats[key]
    if type(value) ~= 'table' then
      table.insert(lines, string.format('%-24s %s', key, tostring(value)))
    end
  end
  local s = stats.status or {}
  table.insert(lines, string.format('%-24s %s %s', 'state', tostring(s.state), s.message or ''))
  if s.model then
    table.insert(lines, string.format('%-24s %s%s', 'model', s.model, s.isRandom and ' (random)' or ''))
  end
  if type(s.lastLatencyMs) == 'number' then
    table.insert(lines, string.format('%-24s %.0f ms, %s steps, %s', 'last fill', s.lastLatencyMs,
      tostring(s.lastSteps), tostring(s.lastStopReason)))
  end
  if type(s.lastHidden) == 'string' then
    table.insert(lines, string.format('%-24s %s (<M-]> asks anyway)', 'last suggestion hidden', s.lastHidden))
  end
  table.insert(lines, 'acceptance rate and latency percentiles: `dfim stats` in a shell')
  return lines
end

local function not_running(what)
  local why = M.failure and (' (' .. M.failure .. '; :DfimRestart tries again)') or ''
  vim.notify('dfim: the server is not running' .. what .. why, vim.log.levels.WARN)
end

function M.stats(on_result)
  local client = M.client_for(nil)
  if not client then
    not_running('')
    return
  end
  compat.request(client, 'dfim/stats', {}, function(err, result)
    if err then
      local why = tostring(err.message or err):gsub('^dfim: ', '')
      vim.notify('dfim: stats failed: ' .. why, vim.log.levels.ERROR)
      return
    end
    local lines = M.format_stats(result or {})
    if on_result then
      on_result(result, lines)
    else
      vim.notify(table.concat(lines, '\n'))
    end
  end)
end

--- Run one of the server's action commands on a range (0-based rows, whole lines).
function M.action(action, first_row, last_row, instruction)
  local bufnr = vim.api.nvim_get_current_buf()
  local client = M.client_for(bufnr)
  if not client then
    not_running(' for this buffer')
    return
  end
  local last = vim.api.nvim_buf_get_lines(bufnr, last_row, last_row + 1, false)[1] or ''
  local args = {
    vim.uri_from_bufnr(bufnr),
    {
      start = { line = first_row, character = 0 },
      ['end'] = { line = last_row, character = compat.character(bufnr, last_row, #last, client.offset_encoding) },
    },
  }
  if instruction and instruction ~= '' then
    table.insert(args, instruction)
  end
  vim.notify('dfim: ' .. action .. '…')
  compat.request(client, 'workspace/executeCommand', { command = 'dfim.' .. action, arguments = args },
    function(err, result)
      if err then
        vim.notify(M.prefixed(err.message or err), vim.log.levels.ERROR)
      elseif type(result) == 'table' and result.applied == false then
        vim.notify('dfim: the buffer changed while the model worked; nothing applied', vim.log.levels.WARN)
      end
    end, bufnr)
end

function M.setup(opts)
  M.did_setup = true -- :checkhealth dfim says when setup() was never called
  M.config = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts or {})
  M.failure, crashes = nil, 0 -- a new configuration (perhaps a fixed `cmd`) may start
  ghost.config.debounce_ms = M.config.debounce_ms
  vim.api.nvim_set_hl(0, 'DfimGhost', { link = 'Comment', default = true })

  local group = vim.api.nvim_create_augroup('dfim', { clear = true })
  -- BufFilePost / BufWritePost: a buffer without a name is attached once it gets one (:file, :w name)
  vim.api.nvim_create_autocmd({ 'FileType', 'BufEnter', 'BufFilePost', 'BufWritePost' }, {
    group = group,
    callback = function(args)
      M.attach(args.buf)
    end,
  })
  vim.api.nvim_create_autocmd('VimLeavePre', {
    group = group,
    callback = function()
      leaving = true
    end,
  })

  local cmd = vim.api.nvim_create_user_command
  cmd('DfimStats', function() M.stats() end, { desc = 'dfim: server counters and the last fill' })
  cmd('DfimToggle', function() M.toggle() end, { desc = 'dfim: inline completions on/off' })
  cmd('DfimTrigger', function() M.trigger() end, { desc = 'dfim: ask for a completion now' })
  cmd('DfimRestart', function() M.restart() end,
    { desc = 'dfim: (re)start the server, also after it failed to start' })
  cmd('DfimRewrite', function(a)
    -- the shipped model ignores the instruction (an instruction-tuned checkpoint reads it)
    local prompt = 'dfim rewrite (optional instruction, ignored by the shipped model): '
    local instruction = a.args ~= '' and a.args or vim.fn.input(prompt)
    M.action('rewriteSelection', a.line1 - 1, a.line2 - 1, instruction)
  end, { range = true, nargs = '?', desc = 'dfim: rewrite the lines' })
  cmd('DfimFillHoles', function(a)
    M.action('fillSelectionHoles', a.line1 - 1, a.line2 - 1)
  end, { range = true, desc = 'dfim: fill every hole in the lines' })
  cmd('DfimRegenerateUnsure', function(a)
    M.action('regenerateUnsure', a.line1 - 1, a.line2 - 1)
  end, { range = true, desc = 'dfim: regenerate the unsure tokens of the lines' })

  -- buffers already open when setup runs (lazy loading)
  for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(bufnr) and vim.bo[bufnr].filetype ~= '' then
      M.attach(bufnr)
    end
  end
end

return M
