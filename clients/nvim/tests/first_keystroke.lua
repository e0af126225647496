-- Driven by tests/clients/test_nvim_client.py: the first keystroke of a session gets a suggestion, with the
-- plugin's own ghost text (the fallback path before 0.12). Reads $DFIM_E2E (JSON), writes the result file.
--
-- Neovim opens the file and goes straight into insert mode while the server is still starting and loading
-- its model: a suggestion must appear with no other key (asked on InsertEnter; held by the server, or asked
-- again when the status turns ready). Then a cursor move in insert mode (no edit), a keystroke, entering
-- insert mode without a cursor move, and an accept with <Tab> must each ask again. Keys go through the typeahead and the main loop (not `feedkeys(..., 'x')`, which would leave
-- insert mode), so each step is a callback run when the condition before it holds.
local cfg = vim.fn.json_decode(os.getenv('DFIM_E2E'))
local steps = dofile(vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':h') .. '/steps.lua')(cfg)
local out, finish, when, keys = steps.out, steps.finish, steps.when, steps.keys

local ok, err = pcall(function()
  vim.opt.runtimepath:prepend(cfg.plugin)
  vim.opt.swapfile = false
  local dfim = require('dfim')
  local ghost = require('dfim.ghost')
  local requests = 0 -- textDocument/inlineCompletion requests the plugin sent
  local compat = require('dfim.compat')
  local request = compat.request
  compat.request = function(client, method, ...)
    if method == 'textDocument/inlineCompletion' then
      requests = requests + 1
    end
    return request(client, method, ...)
  end
  local function shown_at(row, col)
    local st = ghost.states[vim.api.nvim_get_current_buf()]
    return st ~= nil and ghost.visible() and st.row == row and st.col == col
  end

  -- Any CursorMoved autocommand (plugins have them) makes Neovim track the cursor in normal mode too, so that
  -- entering insert mode where the cursor is fires no CursorMovedI: the last step then sees InsertEnter alone.
  vim.api.nvim_create_autocmd('CursorMoved', { callback = function() end })
  dfim.setup({ cmd = cfg.cmd, native = false, settings = cfg.settings })
  vim.cmd('edit ' .. vim.fn.fnameescape(cfg.file))
  out.state_at_insert = dfim.status.state or 'not started'
  keys(string.format('%dGA', cfg.row + 1)) -- into insert mode at the end of the line: nothing else typed

  when('shown after entering insert mode', function() return shown_at(cfg.row, cfg.col) end, cfg.wait_ms, function()
    out.first = { text = ghost.current().text, mode = vim.fn.mode(), requests = requests }
    out.status_when_shown = dfim.status.state
    local before = requests
    -- Cursor moves in insert mode, no edit: one key at a time (CursorMovedI fires once the typeahead is empty,
    -- and only if the cursor is somewhere else by then). The suggestion goes, a new one is asked each time.
    keys('<Left>')

    when('asked again after a cursor move', function() return requests > before and not ghost.visible() end,
      cfg.wait_ms, function()
      local left = requests
      keys('<Right>')

      when('asked again after moving back', function() return requests > left and shown_at(cfg.row, cfg.col) end,
        cfg.wait_ms, function()
        out.moved = { requests = requests - before }
        local tick = vim.api.nvim_buf_get_changedtick(0)
        before = requests
        keys('<BS> ') -- a keystroke (two): the line is as it was, the suggestion comes back

        when('asked again after typing', function()
          return vim.api.nvim_buf_get_changedtick(0) > tick and requests > before and shown_at(cfg.row, cfg.col)
        end, cfg.wait_ms, function()
          out.typed = { requests = requests - before, mode = vim.fn.mode() }
          keys('<Esc>')
          local left_at = (vim.uv or vim.loop).now()
          -- back in normal mode, and past the debounce of the moves: nothing more is asked from here
          when('normal mode', function()
            return vim.fn.mode() == 'n' and (vim.uv or vim.loop).now() - left_at > 300
          end, 5000, function()
            before = requests
            keys('i') -- insert mode where the cursor already is: only InsertEnter can ask

            when('asked on entering insert mode', function() return requests > before end, cfg.wait_ms, function()
              out.entered = { requests = requests - before, mode = vim.fn.mode() }
              keys('<End>') -- back to the end of the line, where the suggestion shows

              when('shown again', function() return shown_at(cfg.row, cfg.col) end, cfg.wait_ms, function()
                local line = vim.api.nvim_get_current_line()
                before = requests
                keys('<Tab>') -- accept: the next suggestion is asked at the new cursor, with no other key

                when('asked after the accept', function()
                  return vim.api.nvim_get_current_line() ~= line and requests > before
                end, cfg.wait_ms, function()
                  out.accepted = { line = vim.api.nvim_get_current_line(), requests = requests - before }
                  local stats_done = false
                  dfim.stats(function(result)
                    out.stats = result
                    stats_done = true
                  end)
                  when('stats', function() return stats_done end, 10000, function() finish() end)
                end)
              end)
            end)
          end)
        end)
      end)
    end)
  end)
end)
if not ok then
  finish(err)
end
