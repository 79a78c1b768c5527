//! Weight storage: aligned buffers, direct I/O reads and the layer streamer.
