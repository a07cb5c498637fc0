package routing

import (
	"slices"
	"strings"
)

// Sizes of the router-to-router share messages as cluster encodes them (cluster/sharewire.go), so
// that the simulator counts the bytes the daemons send, and the packing rules both follow. A
// decision packet is: type, version, kind (3 bytes), the sender's router id and the node id
// (uvarint length + bytes each), the offset of the first hash in the request's chain (uvarint),
// the hash count (uvarint) and 8 bytes per hash. A load packet is: type, version, kind, the
// router id, the report time (8 bytes), its part number and part count (1 byte each), the entry
// count (uvarint) and per entry the node id and three uvarints (requests, tokens, prefill tokens).
// A first-token packet is: type, version, kind, the router id, the observation count (uvarint)
// and per observation the node id and three uvarints (work and TTFT in microseconds, sequences).

// SharePacketBytes is the budget of one share packet: cluster.MaxPacketBytes (one UDP datagram
// with memberlist's framing).
const SharePacketBytes = 1300

// MaxShareChunks bounds the packets one decision is split into: 8 packets carry ~1,200 hashes,
// a 19k-token new suffix at 16-token blocks; the rest of a longer one is not shared (peers then
// under-estimate the node until its summary arrives, which is never a false hit).
const MaxShareChunks = 8

// MaxLoadParts bounds the packets of one load report (a part count fits one byte): 16 parts
// cover ~800 nodes with in-flight requests.
const MaxLoadParts = 16

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

func strLen(s string) int { return uvarintLen(uint64(len(s))) + len(s) }

// shareDecisionFixed is a decision packet without hashes and their count.
func shareDecisionFixed(routerID, nodeID string, offset int) int {
	return 3 + strLen(routerID) + strLen(nodeID) + uvarintLen(uint64(offset))
}

// ShareDecisionBytes is the encoded size of a decision packet carrying n hashes from offset.
func ShareDecisionBytes(routerID, nodeID string, offset, n int) int {
	return shareDecisionFixed(routerID, nodeID, offset) + uvarintLen(uint64(n)) + 8*n
}

// ShareChunk is one decision packet's part of a chain: hashes[From:To].
type ShareChunk struct{ From, To int }

// AppendShareChunks splits hashes[from:] into decision packets that each fit SharePacketBytes,
// at most MaxShareChunks of them, and appends their bounds to dst.
func AppendShareChunks(dst []ShareChunk, routerID, nodeID string, from, total int) []ShareChunk {
	for c := 0; from < total && c < MaxShareChunks; c++ {
		avail := SharePacketBytes - shareDecisionFixed(routerID, nodeID, from) - 2 // ≤ 2-byte count
		n := min(avail/8, total-from)
		if n <= 0 {
			break // ids too long to carry any hash (cannot happen within MaxNodeIDBytes)
		}
		dst = append(dst, ShareChunk{From: from, To: from + n})
		from += n
	}
	return dst
}

// shareLoadFixed is a load packet without entries and their count.
func shareLoadFixed(routerID string) int { return 3 + strLen(routerID) + 8 + 2 }

func loadEntryBytes(l *NodeInFlight) int {
	return strLen(l.Node) + uvarintLen(uint64(max(l.Requests, 0))) + uvarintLen(uint64(max(l.Tokens, 0))) +
		uvarintLen(uint64(max(l.PrefillTokens, 0)))
}

// ShareLoadBytes is the encoded size of a load packet with these entries.
func ShareLoadBytes(routerID string, loads []NodeInFlight) int {
	n := shareLoadFixed(routerID) + uvarintLen(uint64(len(loads)))
	for i := range loads {
		n += loadEntryBytes(&loads[i])
	}
	return n
}

// AppendLoadParts sorts loads by node id and splits them into load packets that each fit
// SharePacketBytes, at most MaxLoadParts (entries beyond are not reported), appending each
// part's end index to dst. A receiver keys a part by (router, part number) and drops the parts
// beyond the count it was told, so a report shrinking to fewer packets leaves nothing stale.
func AppendLoadParts(dst []int, routerID string, loads []NodeInFlight) []int {
	slices.SortFunc(loads, func(a, b NodeInFlight) int { return strings.Compare(a.Node, b.Node) })
	if len(loads) == 0 {
		return append(dst, 0) // an empty report still goes out: it clears the peers' counts
	}
	return appendParts(dst, len(loads), SharePacketBytes-shareLoadFixed(routerID)-2, MaxLoadParts,
		func(i int) int { return loadEntryBytes(&loads[i]) })
}

// appendParts packs n entries of size(i) bytes, in order, into packets of at most budget bytes of
// entries, at most maxParts of them (0: no bound; entries beyond are left out), appending each
// packet's end index to dst.
func appendParts(dst []int, n, budget, maxParts int, size func(int) int) []int {
	start, used := len(dst), 0
	for i := range n {
		b := size(i)
		if used+b > budget && used > 0 {
			dst = append(dst, i)
			used = 0
			if maxParts > 0 && len(dst)-start == maxParts {
				return dst
			}
		}
		used += b
	}
	if used > 0 {
		dst = append(dst, n)
	}
	return dst
}

// ttftEntryBytes is one observation's encoded size.
func ttftEntryBytes(o *TTFTObservation) int {
	return strLen(o.Node) + uvarintLen(uint64(max(o.Work.Microseconds(), 0))) + uvarintLen(uint64(max(o.Seqs, 0))) +
		uvarintLen(uint64(max(o.TTFT.Microseconds(), 0)))
}

// ShareTTFTBytes is the encoded size of a first-token packet with these observations.
func ShareTTFTBytes(routerID string, obs []TTFTObservation) int {
	n := 3 + strLen(routerID) + uvarintLen(uint64(len(obs)))
	for i := range obs {
		n += ttftEntryBytes(&obs[i])
	}
	return n
}

// AppendTTFTParts splits observations into first-token packets that each fit SharePacketBytes,
// appending each packet's end index to dst (none for no observations). Each packet stands
// alone: a lost one costs its peers those observations only.
func AppendTTFTParts(dst []int, routerID string, obs []TTFTObservation) []int {
	return appendParts(dst, len(obs), SharePacketBytes-3-strLen(routerID)-2, 0,
		func(i int) int { return ttftEntryBytes(&obs[i]) })
}
