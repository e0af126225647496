-- Small shims over the Neovim API differences between 0.7 (Debian bookworm) and 0.12.
local M = {}

M.has = function(version)
  return vim.fn.has('nvim-' .. version) == 1
end

M.uv = vim.uv or vim.loop -- vim.loop is the old name (deprecated from 0.10 on)

--- vim.islist (0.10+) or vim.tbl_islist (older; deprecated from 0.10, warns on 0.12).
function M.islist(t)
  return (vim.islist or vim.tbl_islist)(t)
end

--- Start an LSP client for `config` and attach `bufnr`; returns the client id or nil. vim.lsp.start (0.8+)
--- where it exists (vim.lsp.start_client is deprecated from 0.11 and gone in 0.13), else start_client
--- (0.7, which leaves the attaching to the caller). May raise (spawn errors on 0.10): call it in pcall.
function M.start_client(config, bufnr)
  if not vim.lsp.start then
    return vim.lsp.start_client(config)
  end
  local opts = {
    bufnr = bufnr, -- 0.9+; 0.8 attaches the current buffer, hence the nvim_buf_call below
    reuse_client = function()
      return false -- one client of ours at a time, whatever other 'dfim' clients the user runs
    end,
  }
  if M.has('0.9') or bufnr == vim.api.nvim_get_current_buf() then
    return vim.lsp.start(config, opts)
  end
  local id
  vim.api.nvim_buf_call(bufnr, function()
    id = vim.lsp.start(config, opts)
  end)
  return id
end

--- Ask a client to shut down: client:stop() (0.11+) vs client.stop() (older).
function M.stop(client)
  if M.has('0.11') then
    return client:stop()
  end
  return client.stop()
end

-- client:request (0.11+) vs client.request (older); the dot form warns from 0.11 on.
function M.request(client, method, params, handler, bufnr)
  if M.has('0.11') then
    return client:request(method, params, handler, bufnr)
  end
  return client.request(method, params, handler, bufnr)
end

function M.notify(client, method, params)
  if M.has('0.11') then
    return client:notify(method, params)
  end
  return client.notify(method, params)
end

function M.cancel(client, request_id)
  if M.has('0.11') then
    return client:cancel_request(request_id)
  end
  return client.cancel_request(request_id)
end

--- LSP character index of byte column `col` on line `row` (0-based) in the client's encoding.
function M.character(bufnr, row, col, encoding)
  return vim.lsp.util.character_offset(bufnr, row, col, encoding or 'utf-16')
end

--- Byte column of an LSP position on its line.
function M.byte_col(bufnr, position, encoding)
  return vim.lsp.util._get_line_byte_from_position(bufnr, position, encoding or 'utf-16')
end

function M.strchars(s)
  return vim.fn.strchars(s)
end

return M
