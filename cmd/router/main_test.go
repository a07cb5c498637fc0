package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestDispatch(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{
		{"--validate-only", "--insecure-gossip"},          // flags first: serve
		{"serve", "--validate-only", "--insecure-gossip"}, // explicit serve
	} {
		var out, errb bytes.Buffer
		if code := dispatch(ctx, args, &out, &errb); code != 0 || out.String() != "ok\n" {
			t.Errorf("%v: code %d, %q %q", args, code, out.String(), errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := dispatch(ctx, []string{"launch"}, &out, &errb); code != 2 || errb.Len() == 0 {
		t.Errorf("unknown subcommand: code %d, %q", code, errb.String())
	}
}

// TestHelpListsEverySubcommand: --help names every registered subcommand.
func TestHelpListsEverySubcommand(t *testing.T) {
	for _, arg := range []string{"help", "-h", "--help"} {
		var out, errb bytes.Buffer
		if code := dispatch(context.Background(), []string{arg}, &out, &errb); code != 0 {
			t.Fatalf("%s: code %d, %q", arg, code, errb.String())
		}
		for name := range subcommands {
			if !strings.Contains(out.String(), "\n  "+name+" ") {
				t.Errorf("%s does not list %q:\n%s", arg, name, out.String())
			}
		}
	}
}
