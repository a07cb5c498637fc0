package tokenizer

// byteToRune is GPT-2's bytes_to_unicode table, the alphabet of byte-level BPE vocabularies:
// printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100 upwards, in byte order.
var byteToRune [256]rune

// runeToByte inverts byteToRune; -1 for runes outside the alphabet.
var runeToByte = map[rune]int{}

func init() {
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = rune(256 + n)
			n++
		}
		runeToByte[byteToRune[b]] = b
	}
}

// byteLevelDecode maps a byte-level token string back to its raw bytes; ok is false if the token
// has a rune outside the alphabet (an added token, say).
func byteLevelDecode(dst []byte, tok string) ([]byte, bool) {
	for _, r := range tok {
		b, ok := runeToByte[r]
		if !ok {
			return dst, false
		}
		dst = append(dst, byte(b))
	}
	return dst, true
}
