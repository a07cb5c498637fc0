package chat

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"
)

// renderState is one render's view of the request for the Python filters (rewrite.go).
type renderState struct {
	nums    *numberTable
	refused error // set by a filter that met a value it cannot print exactly
}

// bind installs the replacement filters into a render's variables.
func (st *renderState) bind(data map[string]jinja.Value) {
	data[pmStr] = jinja.NewCallable(pmStr, st.str)
	data[pmTojson] = jinja.NewCallable(pmTojson, st.tojson)
	data[pmTrim] = jinja.NewCallable(pmTrim, st.trim)
	data[pmStringFn] = jinja.NewCallable(pmStringFn, st.string)
}

// str prints {{ v }} as Jinja does (str(v)); values the engine already prints as Python does
// (strings, ints, booleans, undefined) are handed back unchanged.
func (st *renderState) str(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 {
		return jinja.Undefined(), errors.New("print takes one value")
	}
	s, ok, err := pyStr(args[0], st.nums)
	if err != nil {
		st.refused = ErrPythonRepr
		return jinja.NewString(""), nil
	}
	if !ok {
		return args[0], nil
	}
	return jinja.NewString(s), nil
}

// softStr is Jinja's soft_str: str(v), "" for undefined.
func (st *renderState) softStr(v jinja.Value) (string, error) {
	switch {
	case v.IsUndefined():
		return "", nil
	case v.IsString():
		return v.AsString(), nil
	case v.IsBool():
		if v.AsBool() {
			return "True", nil
		}
		return "False", nil
	case v.IsInt():
		return fmt.Sprint(v.AsInt()), nil
	}
	s, ok, err := pyStr(v, st.nums)
	if err != nil {
		st.refused = ErrPythonRepr
		return "", nil
	}
	if !ok { // a callable: Python prints its address, nothing to be exact about
		st.refused = ErrPythonRepr
		return "", nil
	}
	return s, nil
}

// string is Jinja's | string.
func (st *renderState) string(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 {
		return jinja.Undefined(), errors.New("string takes no arguments")
	}
	s, err := st.softStr(args[0])
	return jinja.NewString(s), err
}

// trim is Jinja's | trim(chars=None): soft_str(value).strip(chars), Python's whitespace by
// default (U+001C–U+001F included).
func (st *renderState) trim(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 || len(args) > 2 {
		return jinja.Undefined(), errors.New("trim takes at most one argument")
	}
	s, err := st.softStr(args[0])
	if err != nil {
		return jinja.Undefined(), err
	}
	chars := jinja.None()
	if len(args) == 2 {
		chars = args[1]
	} else if c, ok := kwargs["chars"]; ok {
		chars = c
	}
	switch {
	case chars.IsNone() || chars.IsUndefined():
		s = strings.TrimFunc(s, pyIsSpace)
	case chars.IsString():
		s = strings.Trim(s, chars.AsString())
	default:
		return jinja.Undefined(), errors.New("trim: chars must be a string")
	}
	return jinja.NewString(s), nil
}

// tojson is transformers' tojson filter: json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False), its parameters also taken by position in that order.
func (st *renderState) tojson(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("tojson needs a value")
	}
	params := [4]jinja.Value{jinja.NewBool(false), jinja.None(), jinja.None(), jinja.NewBool(false)}
	for i, name := range []string{"ensure_ascii", "indent", "separators", "sort_keys"} {
		if 1+i < len(args) {
			params[i] = args[1+i]
		}
		if v, ok := kwargs[name]; ok {
			params[i] = v
		}
	}
	if len(args) > 5 {
		return jinja.Undefined(), errors.New("tojson: too many arguments")
	}
	o := jsonOpts{ensureASCII: params[0].IsTruthy(), sortKeys: params[3].IsTruthy(), itemSep: ", ", keySep: ": "}
	switch ind := params[1]; {
	case ind.IsNone() || ind.IsUndefined():
	case ind.IsInt():
		o.hasIndent, o.indent = true, strings.Repeat(" ", int(max(0, min(ind.AsInt(), 1<<10))))
	case ind.IsString():
		o.hasIndent, o.indent = true, ind.AsString()
	default:
		return jinja.Undefined(), errors.New("tojson: indent must be an int or a string")
	}
	if o.hasIndent {
		o.itemSep = ","
	}
	if sep := params[2]; !sep.IsNone() && !sep.IsUndefined() {
		if !sep.IsList() || sep.AsList().Len() != 2 || !sep.AsList().Items[0].IsString() || !sep.AsList().Items[1].IsString() {
			return jinja.Undefined(), errors.New("tojson: separators must be two strings")
		}
		o.itemSep, o.keySep = sep.AsList().Items[0].AsString(), sep.AsList().Items[1].AsString()
	}
	var sb strings.Builder
	if err := encodeJSON(&sb, args[0], &o, st.nums, 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(sb.String()), nil
}

// refusal is why r cannot be rendered exactly with a template of these features (nil if it can).
func (r *Request) refusal(f templateFeatures) error {
	in := &r.info
	switch {
	case in.nums != nil && in.nums.ambiguous:
		return fmt.Errorf("%w (two numbers of the request share one float value)", ErrBigInteger)
	case in.nums != nil && len(in.nums.big) > 0 && f.numberTypes:
		return ErrBigInteger
	case in.goPrints && f.stringifies:
		return ErrNumberFormat
	case in.pySpace && f.pyWhitespace:
		return ErrPythonWhitespace
	}
	return nil
}
