package pgfencing

import (
	"errors"
	"testing"
)

func TestTokens(t *testing.T) {
	if q, err := BeginSQL(42); err != nil || q != "BEGIN; SELECT pg_catalog.set_config('pg_fencing.token', '42', true)" {
		t.Fatalf("BeginSQL(42) = %q, %v", q, err)
	}
	for _, bad := range []int64{0, -1, -9223372036854775808} {
		if _, err := BeginSQL(bad); !errors.Is(err, ErrBadToken) {
			t.Errorf("BeginSQL(%d): %v, want ErrBadToken", bad, err)
		}
	}
}

func TestErrorFields(t *testing.T) {
	for _, name := range []string{`quo"te`, `two""quotes`, `x" of table y`, "new\nline", ""} {
		e := NewError(CodeStaleToken, `stale fencing token 9 for resource "`+name+`"`,
			`The write carries fencing token 9, but the high-water mark of resource "`+name+`" is 10.`, "", nil)
		if e.Token != 9 || e.Resource != name || e.HighWater != 10 || e.Row != "" || !e.Superseded() {
			t.Errorf("resource %q: %+v", name, e)
		}
	}
	r := NewError(CodeStaleToken, `stale fencing token 40 for row (7) of table public."my table"`,
		`The high-water mark of row (7) is 50.`, "", nil)
	if r.Token != 40 || r.Row != "(7)" || r.Table != `public."my table"` || r.HighWater != 50 || r.Resource != "" {
		t.Errorf("per-row mode: %+v", r)
	}
	if !errors.Is(r, ErrStaleToken) || errors.Is(r, ErrLeaseLost) {
		t.Errorf("errors.Is by code")
	}
	for code, sup := range map[string]bool{CodeStaleToken: true, CodeNoToken: false, CodeLeaseLost: true,
		CodeProtectionInactive: false, CodeLockServiceUnavailable: false, CodeNotCurrentHolder: true} {
		if NewError(code, "m", "", "", nil).Superseded() != sup {
			t.Errorf("%s: Superseded() != %v", code, sup)
		}
	}
}
