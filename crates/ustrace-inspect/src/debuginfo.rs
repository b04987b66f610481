//! Function parameters and their types from DWARF, for BTF-style fetch
//! arguments (`f:myprobe vfs_read count pos`, `arg->field.sub`).
