-- Driven by tests/clients/test_nvim_client.py: headless Neovim, the real server, one completion accepted.
-- Reads its inputs from $DFIM_E2E (JSON) and writes what happened to the file it names.
-- After that flow, the checks in `more_checks` (below) run in the same Neovim; a failed one raises, and the
-- error lands in the result's `error`, which the Python test fails on. `out.checks` lists those that passed.
local cfg = vim.fn.json_decode(os.getenv('DFIM_E2E'))
local out = { steps = {} }

local function log(msg)
  table.insert(out.steps, msg)
end

local function t(keys)
  return vim.api.nvim_replace_termcodes(keys, true, false, true)
end

local function check(name, cond, detail)
  if not cond then
    error(string.format('check %s failed: %s', name, vim.inspect(detail)), 0)
  end
  out.checks = out.checks or {}
  table.insert(out.checks, name)
end

local function write(path, text)
  vim.fn.mkdir(vim.fn.fnamemodify(path, ':h'), 'p')
  local f = assert(io.open(path, 'w'))
  f:write(text)
  f:close()
end

-- 9. no deprecated API (vim.lsp.start_client warns on 0.12 and is gone in 0.13): recorded, checked at the end
local deprecated = {}
local deprecate = vim.deprecate
vim.deprecate = function(name, ...)
  table.insert(deprecated, tostring(name))
  if deprecate then
    return deprecate(name, ...)
  end
end

local more_checks -- defined below

local function finish()
  local f = io.open(cfg.result, 'w')
  f:write(vim.fn.json_encode(out))
  f:close()
  vim.cmd('qa!')
end

more_checks = function(dfim, ghost)
  local compat = require('dfim.compat')
  local dir = vim.fn.fnamemodify(cfg.file, ':p:h')
  local tmp = vim.fn.tempname()
  local main_buf = vim.api.nvim_get_current_buf()
  local notes = {} -- vim.notify calls: {msg, level}
  local notify = vim.notify
  vim.notify = function(msg, level) -- recorded only (an error message inside vim.cmd would raise)
    table.insert(notes, { msg = msg, level = level })
  end
  local shown = {} -- window/showMessage from the server
  vim.lsp.handlers['window/showMessage'] = function(_, result)
    table.insert(shown, result)
  end
  local function errors()
    local n = 0
    for _, note in ipairs(notes) do
      if note.level == vim.log.levels.ERROR and tostring(note.msg):match('^dfim') then
        n = n + 1
      end
    end
    return n
  end
  local function attached(buf)
    return dfim.client_id ~= nil and vim.lsp.buf_is_attached(buf, dfim.client_id)
  end
  local function our_tab(buf)
    local m = vim.api.nvim_buf_call(buf, function() return vim.fn.maparg('<Tab>', 'i', false, true) end)
    return m.desc == 'dfim: accept the suggestion'
  end
  local function scratch(lines)
    local buf = vim.api.nvim_create_buf(false, true)
    vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
    vim.api.nvim_win_set_buf(0, buf)
    return buf
  end
  local function show(buf, item, row, col)
    vim.api.nvim_win_set_cursor(0, { row + 1, col })
    local cand = ghost.normalize(buf, item, row, col, 'utf-16')
    assert(cand, 'normalize refused ' .. vim.inspect(item))
    ghost.states[buf] = { items = { cand }, index = 1, row = row, col = col, accepted = 0 }
    return cand
  end

  -- 1. settings: an empty table goes out as the JSON object {}, never []
  check('empty settings are {}', vim.json.encode(dfim.json_settings({})) == '{}')
  check('empty groups are {}', vim.json.encode(dfim.json_settings({ sampling = {} })) == '{"sampling":{}}')
  local langs = vim.json.decode(vim.json.encode(dfim.json_settings({ languages = {}, inline = { enabled = false } })))
  check('languages stays a list', (vim.islist or vim.tbl_islist)(langs.languages) and langs.inline.enabled == false, langs)

  -- 10. root_dir: the folder that holds the marker, a file or a folder
  write(tmp .. '/proj/pyproject.toml', '')
  vim.fn.mkdir(tmp .. '/proj/.hg', 'p')
  write(tmp .. '/proj/src/a.py', 'x = 1\n')
  local proj = vim.fn.fnamemodify(tmp .. '/proj', ':p'):gsub('/$', '')
  local abuf = vim.fn.bufadd(tmp .. '/proj/src/a.py')
  check('root_dir of a file marker', dfim.root_dir(abuf, { 'pyproject.toml' }) == proj, dfim.root_dir(abuf, { 'pyproject.toml' }))
  check('root_dir of a folder marker', dfim.root_dir(abuf, { '.hg' }) == proj, dfim.root_dir(abuf, { '.hg' }))

  -- 4. CRLF: the server's \r\n (and a lone \r) are line breaks, never text
  local crlf = scratch({ 'x = ' })
  vim.bo[crlf].fileformat = 'dos'
  local cand = show(crlf, { insertText = '1\r\nprint(x)\rdone' }, 0, 4)
  check('CRLF normalized', cand.text == '1\nprint(x)\ndone', cand.text)
  check('accept line without \\r', ghost.accept_part('line') and vim.api.nvim_buf_get_lines(crlf, 0, -1, false)[1] == 'x = 1')
  check('accept all without \\r', ghost.accept())
  local lines = vim.api.nvim_buf_get_lines(crlf, 0, -1, false)
  check('CRLF buffer lines', vim.deep_equal(lines, { 'x = 1', 'print(x)', 'done' }), lines)

  -- 8. a word accepted, then the rest: the item's range still replaces what it covered after the cursor
  local word = scratch({ 'f(é)' })
  show(word, { insertText = 'ab + c)', range = { start = { line = 0, character = 2 }, ['end'] = { line = 0, character = 4 } } }, 0, 2)
  check('accept word', ghost.accept_part('word'))
  lines = vim.api.nvim_buf_get_lines(word, 0, -1, false)
  check('after the word', lines[1] == 'f(abé)', lines)
  check('accept the rest', ghost.accept())
  lines = vim.api.nvim_buf_get_lines(word, 0, -1, false)
  check('range end kept after a partial accept', lines[1] == 'f(ab + c)', lines)
  -- and with a line break in between: the rest of the line moved to the next line with the cursor
  local multi = scratch({ 'g(é)' })
  show(multi, { insertText = 'a\nb)', range = { start = { line = 0, character = 2 }, ['end'] = { line = 0, character = 4 } } }, 0, 2)
  check('accept line 1', ghost.accept_part('line'))
  check('accept line 2', ghost.accept_part('line'))
  lines = vim.api.nvim_buf_get_lines(multi, 0, -1, false)
  check('range end kept across lines', vim.deep_equal(lines, { 'g(a', 'b)' }), lines)

  -- 7. <Tab> with nothing shown does what it did before dfim
  vim.api.nvim_win_set_buf(0, main_buf)
  vim.bo.expandtab = false
  vim.api.nvim_feedkeys(t('Go<Tab>x<Esc>'), 'x', false)
  lines = vim.api.nvim_buf_get_lines(main_buf, 0, -1, false)
  check('no mapping before: a plain Tab', lines[#lines]:match('^%s*\tx$'), lines[#lines]) -- after autoindent

  -- Tab typed in a new attached buffer (the fallback is captured when a buffer attaches): its first line
  local function tab_in_new_buffer(name, keys)
    write(dir .. '/' .. name, '\n')
    vim.cmd('edit ' .. vim.fn.fnameescape(dir .. '/' .. name))
    local buf = vim.api.nvim_get_current_buf()
    check(name .. ' attached', vim.wait(10000, function() return attached(buf) and our_tab(buf) end, 20))
    vim.api.nvim_feedkeys(t(keys), 'x', false)
    return vim.api.nvim_buf_get_lines(buf, 0, 1, false)
  end

  vim.keymap.set('i', '<Tab>', function() return 'EXPR<Left>' end, { expr = true }) -- global, expr, Lua
  lines = tab_in_new_buffer('tab_expr.py', 'i<Tab>z<Esc>')
  check('global expr mapping before', lines[1] == 'EXPzR', lines)

  vim.cmd('inoremap <Plug>(e2e-plug) PLUG')
  vim.cmd('imap <Tab> <Plug>(e2e-plug)') -- global, recursive
  lines = tab_in_new_buffer('tab_remap.py', 'i<Tab><Esc>')
  check('recursive mapping before', lines[1] == 'PLUG', lines)
  vim.cmd('iunmap <Tab>')

  -- 3. a buffer without a name is not attached; it is once it has one
  vim.cmd('enew')
  local nbuf = vim.api.nvim_get_current_buf()
  local called = 0
  vim.keymap.set('i', '<Tab>', function() called = called + 1 end, { buffer = nbuf }) -- buffer-local callback
  vim.wait(300)
  check('no-name buffer not attached', not attached(nbuf) and not our_tab(nbuf))
  vim.cmd('file ' .. vim.fn.fnameescape(dir .. '/named_later.py'))
  check('attached once named', vim.wait(10000, function() return attached(nbuf) and our_tab(nbuf) end, 20))
  vim.api.nvim_feedkeys(t('i<Tab><Esc>'), 'x', false)
  check('buffer-local callback mapping before', called == 1, called)
  vim.cmd('enew')
  local wbuf = vim.api.nvim_get_current_buf()
  vim.api.nvim_buf_set_lines(wbuf, 0, -1, false, { 'y = 2' })
  vim.wait(200)
  check('second no-name buffer not attached', not attached(wbuf))
  vim.cmd('write ' .. vim.fn.fnameescape(dir .. '/written.py'))
  check('attached once written', vim.wait(10000, function() return attached(wbuf) end, 20))

  -- 2. a missing executable: one error, then nothing on buffer switches until :DfimRestart
  local before = errors()
  dfim.setup({ cmd = { dir .. '/no-such-dfim', 'serve' }, native = false })
  vim.cmd('DfimRestart')
  check('missing executable reported', errors() == before + 1 and dfim.failure ~= nil, notes)
  for _ = 1, 4 do
    vim.cmd('bnext')
    vim.cmd('doautocmd FileType')
  end
  check('missing executable reported once', errors() == before + 1 and dfim.client_id == nil, notes)

  -- a server that exits at once: at most MAX_RESTARTS restarts, then one error
  local counter = dir .. '/starts.txt'
  before = errors()
  dfim.setup({ cmd = { 'sh', '-c', 'echo x >> "$0"; exit 3', counter }, native = false })
  vim.cmd('DfimRestart')
  check('crashing server given up', vim.wait(15000, function() return dfim.failure ~= nil end, 50), dfim.failure)
  for _ = 1, 4 do
    vim.cmd('bnext')
    vim.wait(100)
  end
  vim.wait(800)
  local starts = #vim.fn.readfile(counter)
  check('crash restarts bounded', starts == dfim.MAX_RESTARTS + 1, starts)
  check('crash reported once', errors() == before + 1, notes)

  -- :DfimRestart with a working server and no settings: it starts, and the settings reach it as {}
  local show_before = #shown
  dfim.setup({ cmd = cfg.cmd, native = false })
  vim.cmd('edit ' .. vim.fn.fnameescape(cfg.file))
  vim.cmd('DfimRestart')
  check('restarted', dfim.failure == nil and vim.wait(20000, function() return dfim.client_for(0) ~= nil end, 50))
  local client = dfim.client_for(0)
  check('init_options {}', vim.json.encode(client.config.init_options) == '{}', client.config.init_options)
  check('settings {"dfim":{}}', vim.json.encode(client.config.settings) == '{"dfim":{}}', client.config.settings)
  dfim.status = {}
  check('ready after restart', vim.wait(cfg.wait_ms, function() return dfim.status.state == 'ready' end, 100), dfim.status)
  vim.wait(300)
  local complaints = vim.tbl_filter(function(m) return m.type == 1 end, { unpack(shown, show_before + 1) })
  check('no error from the server about settings', #complaints == 0, complaints)

  -- 11. code actions on a selection, as docs/editors.md says: range_code_action() on 0.7 (and up to 0.9),
  -- code_action({ range = ... }) from 0.8 on; the menu (vim.ui.select) lists dfim's actions
  local menu
  local select = vim.ui.select
  vim.ui.select = function(items, opts, on_choice)
    menu = vim.tbl_map(function(item) return opts.format_item(item) end, items)
    on_choice(nil)
  end
  if vim.lsp.buf.range_code_action and not compat.has('0.8') then
    vim.lsp.buf.range_code_action(nil, { 1, 0 }, { 3, 0 })
  else
    vim.lsp.buf.code_action({ range = { start = { 1, 0 }, ['end'] = { 3, 0 } } })
  end
  check('code actions on a range', vim.wait(20000, function() return menu ~= nil end, 50), menu)
  vim.ui.select = select
  local titles = table.concat(menu, '\n')
  check('the range menu has dfim actions', titles:match('Rewrite the selection') ~= nil, menu)

  -- 12. :checkhealth dfim reports the running server and its model
  vim.cmd('checkhealth dfim')
  local report = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), '\n')
  vim.cmd('tabclose')
  check('checkhealth: setup', report:match('OK:? setup%(%) was called') ~= nil, report)
  check('checkhealth: server', report:match('OK:? the server runs') ~= nil, report)
  check('checkhealth: model', report:match('OK:? model [^\n]+ on cpu') ~= nil, report)
  check('checkhealth: no error', not report:match('ERROR'), report)
  check('checkhealth: buffers', report:match('OK:? %d+ of %d+ open file buffers attached') ~= nil, report)

  -- 13. one `dfim: ` in front of a server message that has its own: an action the server refuses (no hole in
  -- the line) is reported as `dfim: ...`, never `dfim: dfim: ...`
  check('one prefix', dfim.prefixed('dfim: the model is not ready') == 'dfim: the model is not ready')
  check('prefix added', dfim.prefixed('oops') == 'dfim: oops')
  local first_note = #notes + 1
  local refused
  dfim.action('fillSelectionHoles', 0, 0)
  check('refused action reported', vim.wait(20000, function()
    for i = first_note, #notes do
      if notes[i].level == vim.log.levels.ERROR then
        refused = tostring(notes[i].msg)
      end
    end
    return refused ~= nil
  end, 50), notes)
  check('refused action: one prefix', refused:match('^dfim: ') and not refused:match('^dfim: dfim:'), refused)
  check('no deprecated API used', #deprecated == 0, deprecated)
  vim.notify = notify
end

local ok, err = pcall(function()
  vim.opt.runtimepath:prepend(cfg.plugin)
  vim.opt.swapfile = false
  vim.opt.virtualedit = 'onemore' -- a normal-mode cursor may sit after the last character, as in insert mode
  local dfim = require('dfim')
  local ghost = require('dfim.ghost')
  dfim.setup({ cmd = cfg.cmd, native = false, settings = cfg.settings })
  vim.cmd('edit ' .. vim.fn.fnameescape(cfg.file))
  out.attached = vim.wait(20000, function() return dfim.client_for(0) ~= nil end, 50)
  log('attached=' .. tostring(out.attached))
  out.ready = vim.wait(cfg.wait_ms, function() return dfim.status.state == 'ready' end, 100)
  out.status = dfim.status
  log('ready=' .. tostring(out.ready))
  if not out.ready then return end

  vim.api.nvim_win_set_cursor(0, { cfg.row + 1, cfg.col })
  out.before = vim.api.nvim_buf_get_lines(0, 0, -1, false)
  local done, shown = false, false
  dfim.trigger(function(got, e)
    done, shown = true, got
    if e then out.request_error = tostring(e.message or e) end
  end)
  vim.wait(cfg.wait_ms, function() return done end, 50)
  out.pending_left = next(ghost.pending) ~= nil -- the answered request is no longer pending
  out.shown = shown
  log('shown=' .. tostring(shown))
  if not shown then return end
  local cand = ghost.current()
  out.item = cand.raw
  out.text = cand.text
  out.id = cand.id
  out.marks = #vim.api.nvim_buf_get_extmarks(0, vim.api.nvim_create_namespace('dfim_ghost'), 0, -1, {})
  out.statusline = dfim.statusline()

  out.tab_mapped = vim.fn.maparg('<Tab>', 'i', false, true).expr == 1

  -- accept the first word, then the rest: the word goes in, the rest stays on screen
  out.accepted_word = dfim.accept_word()
  out.after_word = vim.api.nvim_buf_get_lines(0, 0, -1, false)
  out.rest = ghost.current() and ghost.current().text
  out.marks_word = #vim.api.nvim_buf_get_extmarks(0, vim.api.nvim_create_namespace('dfim_ghost'), 0, -1, {})
  out.accepted = dfim.accept()
  out.after = vim.api.nvim_buf_get_lines(0, 0, -1, false)
  out.cursor = vim.api.nvim_win_get_cursor(0)
  out.marks_after = #vim.api.nvim_buf_get_extmarks(0, vim.api.nvim_create_namespace('dfim_ghost'), 0, -1, {})

  -- :DfimStats goes over the same pipe after the accept command, so the server has handled that by now
  local stats_done = false
  dfim.stats(function(result, lines)
    out.stats = result
    out.stats_lines = lines
    stats_done = true
  end)
  vim.wait(10000, function() return stats_done end, 50)
  log('stats=' .. tostring(stats_done))
  check('pending request cleared once answered', not out.pending_left)
  more_checks(dfim, ghost)
end)
if not ok then
  out.error = tostring(err)
end
finish()
