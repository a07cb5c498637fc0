package kvevents

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// maxSkipDepth bounds the nesting of a value the decoder skips (an unknown field or event):
// engine events nest three or four levels; 64 leaves room for any future field.
const maxSkipDepth = 64

// skip consumes one value without trusting its declared sizes: a string, binary or extension
// longer than the bytes left, or an array or map with more elements than bytes left, is an
// error before anything is read or allocated (the library's Skip would read a declared 3 GiB
// extension chunk by chunk).
func (d *Decoder) skip() error { return d.skipDepth(0) }

func (d *Decoder) skipDepth(depth int) error {
	if depth > maxSkipDepth {
		return fmt.Errorf("value nested deeper than %d", maxSkipDepth)
	}
	c, err := d.dec.PeekCode()
	if err != nil {
		return err
	}
	var n int
	switch {
	case isArray(c) || isMap(c):
		if isArray(c) {
			n, err = d.dec.DecodeArrayLen()
		} else {
			n, err = d.dec.DecodeMapLen()
			n *= 2
		}
		if err != nil {
			return err
		}
		if n > d.r.Len() {
			return fmt.Errorf("container of %d elements past the end", n)
		}
		for i := 0; i < n; i++ {
			if err := d.skipDepth(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isStrOrBin(c):
		if n, err = d.dec.DecodeBytesLen(); err != nil {
			return err
		}
		return d.skipBytes(max(n, 0))
	case c == msgpcode.FixExt1 || c == msgpcode.FixExt2 || c == msgpcode.FixExt4 || c == msgpcode.FixExt8 ||
		c == msgpcode.FixExt16 || c == msgpcode.Ext8 || c == msgpcode.Ext16 || c == msgpcode.Ext32:
		_, n, err := d.dec.DecodeExtHeader()
		if err != nil {
			return err
		}
		return d.skipBytes(n)
	default: // nil, bool, numbers: fixed small sizes
		return d.dec.Skip()
	}
}
