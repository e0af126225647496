-- Driven by tests/clients/test_nvim_client.py: Tab-Tab and cycling with the plugin's own ghost text, keys
-- typed in insert mode against the real server. Reads $DFIM_E2E (JSON; `flow` is 'tabtab' or 'cycle'),
-- writes what happened to the result file; the Python test asserts on it.
--
-- tabtab: a suggestion is shown, the server speculates the next one; <Tab> accepts, the plugin asks at the
--   new cursor by itself, and `dfim/stats` before and after say whether that answer came from the speculation.
-- cycle: a suggestion is shown; <M-]> asks the server for alternatives and shows another one, <M-]> again
--   steps on without asking, <M-[> steps back; <Tab> accepts the one on screen. On the next suggestion,
--   <M-]> then a word accepted (<M-Right>): <M-]> asks again at the new cursor.
--
-- Keys go through the typeahead and the main loop (as in first_keystroke.lua), so each step is a callback run
-- once the condition before it holds.
local cfg = vim.fn.json_decode(os.getenv('DFIM_E2E'))
local steps = dofile(vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':h') .. '/steps.lua')(cfg)
local out, finish, when, keys = steps.out, steps.finish, steps.when, steps.keys

local ok, err = pcall(function()
  vim.opt.runtimepath:prepend(cfg.plugin)
  vim.opt.swapfile = false
  local dfim = require('dfim')
  local ghost = require('dfim.ghost')
  local compat = require('dfim.compat')

  -- Every inline request the plugin sends (params and the server's items) and every command it runs.
  out.requests, out.commands = {}, {}
  local request = compat.request
  compat.request = function(client, method, params, handler, bufnr)
    if method == 'workspace/executeCommand' then
      table.insert(out.commands, params)
    elseif method == 'textDocument/inlineCompletion' then
      local sent = { params = params }
      table.insert(out.requests, sent)
      local inner = handler
      handler = function(e, result, ...)
        sent.answered = true
        sent.items = result and (result.items or result) or {}
        return inner(e, result, ...)
      end
    end
    return request(client, method, params, handler, bufnr)
  end
  local function answered()
    local last = out.requests[#out.requests]
    return last ~= nil and last.answered == true
  end
  --- Ask `dfim/stats` until `pred(result)` holds, then store the result as out[into] and run `next`.
  local function stats_when(into, pred, next)
    local got, asking = nil, false
    when('stats ' .. into, function()
      if got and pred(got) then return true end
      if not asking then
        asking = true
        dfim.stats(function(result) got, asking = result, false end)
      end
      return false
    end, cfg.wait_ms, function()
      out[into] = got
      next()
    end)
  end
  local function shown()
    local st = ghost.states[vim.api.nvim_get_current_buf()]
    local cand = st and st.items[st.index]
    return cand and {
      text = cand.text, id = cand.id, index = st.index, count = #st.items, invoked = st.invoked == true,
      row = st.row, col = st.col,
      texts = vim.tbl_map(function(c) return c.text end, st.items),
      marks = #vim.api.nvim_buf_get_extmarks(0, vim.api.nvim_create_namespace('dfim_ghost'), 0, -1, {}),
    }
  end

  dfim.setup({ cmd = cfg.cmd, native = false, settings = cfg.settings })
  vim.cmd('edit ' .. vim.fn.fnameescape(cfg.file))
  when('ready', function() return dfim.status.state == 'ready' end, cfg.wait_ms, function()
    keys(string.format('%dGA', cfg.row + 1)) -- into insert mode at the end of the line: the plugin asks

    when('shown', function() return answered() and ghost.visible() end, cfg.wait_ms, function()
      out.first = shown()
      out.line_before = vim.api.nvim_get_current_line()

      if cfg.flow == 'tabtab' then
        -- the server started the next suggestion's fill before it answered (the test checks the count)
        stats_when('before', function() return true end, function()
          local asked = #out.requests
          keys('<Tab>') -- accept: the plugin asks at the new cursor with no other key

          when('asked after the accept', function() return #out.requests > asked and answered() end,
            cfg.wait_ms, function()
            out.after_accept = out.requests[#out.requests]
            out.asked_after = #out.requests - asked
            out.line = vim.api.nvim_get_current_line()
            out.cursor = vim.api.nvim_win_get_cursor(0)
            out.mode = vim.fn.mode()
            out.second = shown()
            stats_when('after', function() return true end, function() finish() end)
          end)
        end)
      elseif cfg.flow == 'cycle' then
        local asked = #out.requests
        keys('<M-]>') -- next: the plugin asks for alternatives (Invoked) and shows another one

        when('cycled', function() return #out.requests > asked and answered() and ghost.visible() end,
          cfg.wait_ms, function()
          out.cycle_request = out.requests[#out.requests]
          out.next1 = shown()
          local before = #out.requests
          keys('<M-]>') -- next again: a step through what is there, nothing asked

          when('cycled again', function() return shown().index ~= out.next1.index end, 5000, function()
            out.next2 = shown()
            keys('<M-[>') -- and back

            when('cycled back', function() return shown().index == out.next1.index end, 5000, function()
              out.back = shown()
              out.asked_while_cycling = #out.requests - before
              local commands = #out.commands
              keys('<Tab>') -- accept the one on screen

              when('accepted', function() return #out.commands > commands end, 5000, function()
                out.accept_command = out.commands[#out.commands]
                out.line = vim.api.nvim_buf_get_lines(0, cfg.row, cfg.row + 1, false)[1]
                out.lines = vim.api.nvim_buf_get_lines(0, 0, -1, false)
                -- the next suggestion (asked after the accept), cycled to, and a word of it accepted: what is
                -- left is one item, and <M-]> asks for alternatives again, at the new cursor
                when('shown after the accept', function() return answered() and ghost.visible() end, cfg.wait_ms,
                  function()
                  local asked_before = #out.requests
                  keys('<M-]>')
                  when('cycled after the accept', function()
                    return #out.requests > asked_before and answered() and (shown() or {}).invoked
                  end, cfg.wait_ms, function()
                    keys('<M-Right>')
                    when('a word accepted', function() return vim.api.nvim_get_current_line() ~= out.line end, 5000,
                      function()
                      out.word_cursor = vim.api.nvim_win_get_cursor(0)
                      out.word_line = vim.api.nvim_get_current_line()
                      asked_before = #out.requests
                      keys('<M-]>')
                      when('cycled after the word', function() return #out.requests > asked_before end, 5000,
                        function()
                        out.cycle_after_word = out.requests[#out.requests].params
                        finish()
                      end)
                    end)
                  end)
                end)
              end)
            end)
          end)
        end)
      else
        finish('unknown flow ' .. tostring(cfg.flow))
      end
    end)
  end)
end)
if not ok then
  finish(err)
end
