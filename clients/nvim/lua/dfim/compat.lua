-- Small shims over the Neovim API differences between 0.7 (Debian bookworm) and 0.12.
local M = {}

M.has = function(version)
  return vim.fn.has('nvim-' .. version) == 1
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
