package main

import (
	"fmt"
	"regexp"
	"strings"
)

// heading matches a version's heading in CHANGELOG.md: "## v0.1.0 — 2026-12-05",
// "## v0.2.0 — unreleased" or "## Unreleased".
var heading = regexp.MustCompile(`(?m)^## +(v\d+\.\d+\.\d+\S*|Unreleased)\b(.*)$`)

// dated matches the date a released version's heading carries.
var dated = regexp.MustCompile(`\b\d{4}-\d{2}-\d{2}\b`)

// releaseSection reports an error unless the changelog has a section for
// version whose heading carries its date.
func releaseSection(changelog, version string) error {
	for _, m := range heading.FindAllStringSubmatch(changelog, -1) {
		if m[1] != version {
			continue
		}
		if !dated.MatchString(m[2]) {
			return fmt.Errorf("CHANGELOG.md: the heading %q has no date: write \"## %s — YYYY-MM-DD\" before the release", strings.TrimSpace(m[0]), version)
		}
		return nil
	}
	return fmt.Errorf("CHANGELOG.md has no section for %s: write \"## %s — YYYY-MM-DD\" with what changed and how to migrate", version, version)
}

// sectionsAfter returns the text of the changelog above the heading of
// version: what changed since that release.
func sectionsAfter(changelog, version string) (string, error) {
	for _, loc := range heading.FindAllStringSubmatchIndex(changelog, -1) {
		if changelog[loc[2]:loc[3]] == version {
			return changelog[:loc[0]], nil
		}
	}
	return "", fmt.Errorf("CHANGELOG.md has no section for %s, the release the API is compared with", version)
}

// lists reports whether the changelog text names an API change of the
// package named pkg: name is apidiff's (Foo, Guard.Bar, (*Guard).Bar,
// Config.Field). A top-level name counts when the text writes it qualified
// (idem.Foo); a method or field when the text writes Type.Name, qualified
// or not, in any of Go's ways ((*idem.Guard).Bar, idem.Guard.Bar, Guard.Bar).
func lists(text, pkg, name string) bool {
	norm := strings.NewReplacer("(", "", ")", "", "*", "")
	text, name = norm.Replace(text), norm.Replace(name)
	if strings.Contains(name, ".") && containsWord(text, name) {
		return true
	}
	return containsWord(text, pkg+"."+name)
}

// containsWord reports whether text holds s, not as a part of a longer name.
func containsWord(text, s string) bool {
	for i := 0; ; {
		j := strings.Index(text[i:], s)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(s)
		if (start == 0 || !nameByte(text[start-1])) && (end == len(text) || !nameByte(text[end])) {
			return true
		}
		i = start + 1
	}
}

// nameByte reports whether b may continue a Go name.
func nameByte(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}
