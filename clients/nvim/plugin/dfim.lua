-- Nothing starts until require('dfim').setup{} is called (lazy.nvim: `opts = {}` does that).
if vim.g.loaded_dfim then
  return
end
vim.g.loaded_dfim = true
