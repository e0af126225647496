-- :checkhealth dfim — whether the plugin can work here: Neovim's version and the completion path it uses,
-- setup() called, the server command found and runnable, the server's state and model, the current buffer.
local M = {}

-- vim.health.start/ok/... (0.10+), vim.health.report_* (0.8, 0.9; gone in 0.11), require('health') (0.7)
local health = vim.health or require('health')
local start = health.start or health.report_start
local ok = health.ok or health.report_ok
local info = health.info or health.report_info
local warn = health.warn or health.report_warn
local fail = health.error or health.report_error

local function check_neovim(dfim)
  local v = vim.version()
  local version = string.format('%d.%d.%d', v.major, v.minor, v.patch)
  if vim.fn.has('nvim-0.7') ~= 1 then
    fail('Neovim ' .. version .. ': dfim needs 0.7 or newer')
    return
  end
  ok('Neovim ' .. version)
  local native = vim.lsp.inline_completion ~= nil and vim.lsp.inline_completion.enable ~= nil
  if native and dfim.config.native ~= false then
    info('inline completions: the built-in vim.lsp.inline_completion (0.12+)')
  else
    info("inline completions: dfim's own ghost text" .. (native and ' (native = false)' or ''))
  end
  if vim.fn.has('nvim-0.8') ~= 1 then
    info('code actions on a selection: :\'<,\'>lua vim.lsp.buf.range_code_action() (0.7; newer: code_action())')
  end
end

local function check_command(dfim)
  local cmd = dfim.config.cmd
  if type(cmd) ~= 'table' or type(cmd[1]) ~= 'string' then
    info('cmd is not a list of strings; not checked: ' .. vim.inspect(cmd))
    return false
  end
  if vim.fn.executable(cmd[1]) ~= 1 then
    fail(string.format('cmd[1] `%s` is not an executable file', cmd[1]), {
      'Give its full path in setup(), e.g. cmd = { vim.fn.expand("~/dfim/.venv/bin/dfim"), "serve" }',
      "Neovim started from a desktop menu does not see your shell's PATH",
    })
    return false
  end
  ok('server command: ' .. vim.fn.exepath(cmd[1]) .. ' ' .. table.concat(cmd, ' ', 2))
  if cmd[2] == 'serve' then -- it is dfim's CLI: ask it for its version (imports torch: a few seconds)
    local out = vim.fn.system({ cmd[1], '--version' })
    local first = vim.split(out, '\n', { plain = true })[1] or ''
    if vim.v.shell_error == 0 and first:match('^dfim ') then
      ok(first)
    else
      fail(string.format('`%s --version` failed (exit %d): %s', cmd[1], vim.v.shell_error, first), {
        'Reinstall dfim (./install.sh in its repository)',
      })
      return false
    end
  end
  return true
end

local function check_server(dfim)
  if dfim.failure then
    fail('the server is not started any more: ' .. dfim.failure, { 'Fix it, then run :DfimRestart' })
    return
  end
  local client = dfim.client_for(nil)
  if not client then
    info('the server is not running; it starts when a buffer with a file name is opened')
    return
  end
  ok(string.format('the server runs (client id %d)', client.id))
  local s = dfim.status or {}
  if s.state == 'ready' or s.state == 'busy' then
    ok(string.format('model %s on %s%s', tostring(s.model), tostring(s.device),
      s.isRandom and ' (an untrained test checkpoint)' or ''))
  elseif s.state == 'error' then
    fail('the model could not be loaded: ' .. tostring(s.message), { 'Check the settings model.path and model.device' })
  else
    info('the model is loading' .. (s.message and s.message ~= '' and (': ' .. s.message) or ''))
  end
  if not dfim.enabled() then
    warn('inline completions are off (:DfimToggle)')
  end
  -- :checkhealth shows its report in a buffer of its own, so "the current buffer" is never the user's: count
  -- the open file buffers instead
  local files, attached = 0, 0
  for _, b in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(b) and vim.bo[b].buflisted and vim.bo[b].buftype == ''
      and vim.api.nvim_buf_get_name(b) ~= '' then
      files = files + 1
      if dfim.client_for(b) then
        attached = attached + 1
      end
    end
  end
  if attached > 0 then
    ok(string.format('%d of %d open file buffers attached', attached, files))
  else
    info(string.format('none of %d open file buffers attached (another filetype, or opened before setup())', files))
  end
end

function M.check()
  start('dfim')
  local loaded, dfim = pcall(require, 'dfim')
  if not loaded then
    fail('require("dfim") failed: ' .. tostring(dfim))
    return
  end
  check_neovim(dfim)
  if not dfim.did_setup then
    warn('require("dfim").setup() was not called: nothing starts', { 'Call it in your init.lua (docs/editors.md)' })
    return
  end
  ok('setup() was called')
  check_command(dfim)
  check_server(dfim)
end

return M
