-- The step machinery the end-to-end drivers share (first_keystroke.lua, tabtab.lua): a result table, `finish`
-- (write it to the result file and quit), `when` (run the next step once a condition holds) and `keys` (type as
-- a user would). Keys go through the typeahead and the main loop (not `feedkeys(..., 'x')`, which would leave
-- insert mode), so each step is a callback run once the condition before it holds.
--
--   local steps = dofile(vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':h') .. '/steps.lua')(cfg)
return function(cfg)
  local uv = vim.uv or vim.loop
  local steps = { out = { steps = {} } }

  --- Write the result (with `err`, if any) to `cfg.result` and quit Neovim.
  function steps.finish(err)
    if err then
      steps.out.error = tostring(err)
    end
    local f = io.open(cfg.result, 'w')
    f:write(vim.fn.json_encode(steps.out))
    f:close()
    vim.cmd('qa!')
  end

  --- Run `next` once `cond()` holds (checked every 20 ms); after `timeout_ms`, finish with an error.
  function steps.when(name, cond, timeout_ms, next)
    local deadline = uv.now() + timeout_ms
    local function poll()
      local ok, held = pcall(cond)
      if not ok then
        return steps.finish(held)
      end
      if held then
        table.insert(steps.out.steps, name)
        local ran, err = pcall(next)
        if not ran then
          steps.finish(err)
        end
      elseif uv.now() > deadline then
        steps.finish('timed out waiting for: ' .. name)
      else
        vim.defer_fn(poll, 20)
      end
    end
    poll()
  end

  --- Type `k` as a user would: through mappings (the plugin's <Tab>), unlike feedkeys' 'n' mode.
  function steps.keys(k)
    vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(k, true, false, true), 'm', false)
  end

  return steps
end
