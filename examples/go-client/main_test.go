package main

import (
	"testing"
	"time"
)

func TestFencedOffSQLSTATEsStopTheClient(t *testing.T) {
	for _, code := range []string{"FT001", "FT003", "FT006"} {
		if got := classify(code); got != "fenced off" {
			t.Errorf("classify(%q) = %q, want fenced off", code, got)
		}
	}
}

func TestSerializationFailuresAndDeadlocksAreRetried(t *testing.T) {
	for _, code := range []string{"40001", "40P01"} {
		if got := classify(code); got != "retry" {
			t.Errorf("classify(%q) = %q, want retry", code, got)
		}
	}
}

func TestOtherErrorsAreOrdinaryFailures(t *testing.T) {
	for _, code := range []string{"FT002", "FT004", "FT005", "23505", "55P03", "08006", "ft001", ""} {
		if got := classify(code); got != "failed" {
			t.Errorf("classify(%q) = %q, want failed", code, got)
		}
	}
}

func TestParsesArguments(t *testing.T) {
	a, err := parseArgs([]string{"--etcd", "10.0.0.1:2379,10.0.0.2:2379", "--pg", "host=db port=5433",
		"--lock", "L", "--ttl", "2", "--account", "7", "--amount", "-5", "--writes", "3",
		"--interval-ms", "250", "--style", "function"})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.etcd) != 2 || a.etcd[1] != "10.0.0.2:2379" || a.pg != "host=db port=5433" || a.lock != "L" ||
		a.ttl != 2 || a.account != 7 || a.amount != -5 || a.writes != 3 ||
		a.interval != 250*time.Millisecond || a.style != "function" {
		t.Errorf("parsed %+v", a)
	}
	d, err := parseArgs(nil)
	if err != nil || d.lock != "settlement" || d.ttl != 10 || d.style != "sql" || d.writes != 1 {
		t.Errorf("defaults %+v, %v", d, err)
	}
}

func TestRejectsBadArguments(t *testing.T) {
	for _, argv := range [][]string{{"--ttl", "0"}, {"--style", "orm"}, {"--writes", "x"}, {"extra"}, {"--nope"}} {
		if _, err := parseArgs(argv); err == nil {
			t.Errorf("parseArgs(%q) accepted", argv)
		}
	}
}
