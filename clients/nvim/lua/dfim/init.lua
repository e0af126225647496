-- dfim for Neovim: starts `dfim serve`, shows inline completions (vim.lsp.inline_completion on 0.12+, our
-- own ghost text before), keymaps for accept / word / line / next / previous / dismiss, :DfimStats,
-- :DfimToggle, :DfimRewrite. Code actions come through the normal LSP menu (vim.lsp.buf.code_action()).
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
    accept = '<Tab>', -- falls back to a plain <Tab> when nothing is shown
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

--- One line for a statusline: `dfim 84ms 6 steps`, `dfim …` while busy, `dfim !` on error.
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
    return string.format('dfim %dms %s steps', math.floor(s.lastLatencyMs + 0.5), tostring(s.lastSteps or '?'))
  end
  return 'dfim'
end

local function root_dir(bufnr)
  local name = vim.api.nvim_buf_get_name(bufnr)
  local dir = name ~= '' and vim.fn.fnamemodify(name, ':p:h') or vim.loop.cwd()
  for _, marker in ipairs(M.config.root_markers) do
    local found = vim.fn.finddir(marker, dir .. ';')
    if found == '' then
      found = vim.fn.findfile(marker, dir .. ';')
    end
    if found ~= '' then
      return vim.fn.fnamemodify(found, ':p:h:h')
    end
  end
  return dir
end

local function wanted(bufnr)
  if vim.bo[bufnr].buftype ~= '' or not vim.api.nvim_buf_is_loaded(bufnr) then
    return false
  end
  local fts = M.config.filetypes
  if not fts then
    return true
  end
  return vim.tbl_contains(fts, vim.bo[bufnr].filetype)
end

local function map_keys(bufnr)
  local k = M.config.keymaps
  local function map(lhs, fn, desc, expr)
    if lhs and lhs ~= '' then
      vim.keymap.set('i', lhs, fn, { buffer = bufnr, desc = desc, expr = expr, silent = true })
    end
  end
  local fallback = k.accept and vim.api.nvim_replace_termcodes(k.accept, true, false, true)
  map(k.accept, function()
    if use_native() then
      -- get() accepts what is shown and says so; nothing shown: the key does what it always did
      return vim.lsp.inline_completion.get() and '' or fallback
    end
    if ghost.visible() then
      return '<Cmd>lua require("dfim").accept()<CR>' -- an expr mapping may not edit the buffer itself
    end
    return fallback
  end, 'dfim: accept the suggestion', true)
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

--- Start the server if needed and attach `bufnr` to it.
function M.attach(bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  if not wanted(bufnr) then
    return
  end
  if not M.client_for(nil) then
    M.client_id = vim.lsp.start_client({
      name = 'dfim',
      cmd = M.config.cmd,
      root_dir = root_dir(bufnr),
      init_options = M.config.settings,
      settings = { dfim = M.config.settings }, -- answers workspace/configuration for section "dfim"
      handlers = {
        ['dfim/status'] = function(_, result)
          M.status = result or {}
          vim.cmd('redrawstatus')
        end,
      },
      on_attach = on_attach,
      on_exit = function()
        M.client_id = nil
      end,
    })
    if not M.client_id then
      vim.notify('dfim: could not start ' .. table.concat(M.config.cmd, ' '), vim.log.levels.ERROR)
      return
    end
  end
  if not vim.lsp.buf_is_attached(bufnr, M.client_id) then
    vim.lsp.buf_attach_client(bufnr, M.client_id)
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

--- Ask for a completion at the cursor now (ghost text mode), e.g. from a mapping or a test.
function M.trigger(on_done)
  ghost.request(nil, true, on_done)
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
  table.insert(lines, 'acceptance rate and latency percentiles: `dfim stats` in a shell')
  return lines
end

function M.stats(on_result)
  local client = M.client_for(nil)
  if not client then
    vim.notify('dfim: the server is not running', vim.log.levels.WARN)
    return
  end
  compat.request(client, 'dfim/stats', {}, function(err, result)
    if err then
      vim.notify('dfim: stats failed: ' .. tostring(err.message or err), vim.log.levels.ERROR)
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
    vim.notify('dfim: the server is not running for this buffer', vim.log.levels.WARN)
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
        vim.notify('dfim: ' .. tostring(err.message or err), vim.log.levels.ERROR)
      elseif type(result) == 'table' and result.applied == false then
        vim.notify('dfim: the buffer changed while the model worked; nothing applied', vim.log.levels.WARN)
      end
    end, bufnr)
end

function M.setup(opts)
  M.config = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts or {})
  ghost.config.debounce_ms = M.config.debounce_ms
  vim.api.nvim_set_hl(0, 'DfimGhost', { link = 'Comment', default = true })

  local group = vim.api.nvim_create_augroup('dfim', { clear = true })
  vim.api.nvim_create_autocmd({ 'FileType', 'BufEnter' }, {
    group = group,
    callback = function(args)
      M.attach(args.buf)
    end,
  })

  local cmd = vim.api.nvim_create_user_command
  cmd('DfimStats', function() M.stats() end, { desc = 'dfim: server counters and the last fill' })
  cmd('DfimToggle', function() M.toggle() end, { desc = 'dfim: inline completions on/off' })
  cmd('DfimTrigger', function() M.trigger() end, { desc = 'dfim: ask for a completion now' })
  cmd('DfimRewrite', function(a)
    local instruction = a.args ~= '' and a.args or vim.fn.input('dfim rewrite (optional instruction): ')
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
