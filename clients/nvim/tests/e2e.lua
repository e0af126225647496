-- Driven by tests/test_nvim_client.py: headless Neovim, the real server, one completion accepted.
-- Reads its inputs from $DFIM_E2E (JSON) and writes what happened to the file it names.
local cfg = vim.fn.json_decode(os.getenv('DFIM_E2E'))
local out = { steps = {} }

local function log(msg)
  table.insert(out.steps, msg)
end

local function finish()
  local f = io.open(cfg.result, 'w')
  f:write(vim.fn.json_encode(out))
  f:close()
  vim.cmd('qa!')
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
end)
if not ok then
  out.error = tostring(err)
end
finish()
