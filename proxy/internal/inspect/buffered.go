package inspect

// Buffered is the bytes s keeps of a frame cut by a chunk boundary (the
// capacity of its frame buffer), 0 when it keeps none.
func (s *Stream) Buffered() int {
	if s.buf == nil {
		return 0
	}
	return cap(*s.buf)
}

// Buffered is the compressed bytes g keeps of a member cut by reads and
// holds for the stream's end (their buffers' capacity), 0 when none.
func (g *Gzip) Buffered() int {
	n := cap(g.held)
	if g.pending != nil {
		n += cap(*g.pending)
	}
	return n
}
