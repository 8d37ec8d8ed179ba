package luamut

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMutants(t *testing.T) {
	src := `-- a comment: if x == 1 then redis.call('DEL', KEYS[1]) end
local v = redis.call('GET', KEYS[1])
if not v or v ~= '== 2' then
  return {3, -1}
end
--[[ long
comment < 5 ]]
redis.call('DEL', KEYS[2], 'x')
while i <= #v and c + 0x070000 > 2 do i = i - 1 end
return 0
`
	var got []string
	for _, m := range Mutants("t.lua", src) {
		got = append(got, m.ID())
	}
	require.Equal(t, []string{
		`t.lua:2:11 call "redis.call('GET', KEYS[1])" -> "false"`,
		`t.lua:2:34 constant "1" -> "2"`,
		`t.lua:3:4 branch "not v or v ~= '== 2'" -> "false"`,
		`t.lua:3:4 not "not " -> ""`,
		`t.lua:3:10 logical "or" -> "and"`,
		`t.lua:3:15 compare "~=" -> "=="`,
		`t.lua:4:11 constant "3" -> "4"`,
		`t.lua:4:15 constant "1" -> "2"`,
		`t.lua:8:1 call "redis.call('DEL', KEYS[2], 'x')" -> ""`,
		`t.lua:8:24 constant "2" -> "3"`,
		`t.lua:9:7 branch "i <= #v and c + 0x070000 > 2" -> "false"`,
		`t.lua:9:9 boundary "<=" -> "<"`,
		`t.lua:9:15 logical "and" -> "or"`,
		`t.lua:9:21 arith "+" -> "-"`,
		`t.lua:9:23 constant "0x070000" -> "0x070001"`,
		`t.lua:9:32 boundary ">" -> ">="`,
		`t.lua:9:34 constant "2" -> "3"`,
		`t.lua:9:45 arith "-" -> "+"`,
		`t.lua:9:47 constant "1" -> "2"`,
		`t.lua:10:8 constant "0" -> "1"`,
	}, got)
}

func TestMutantSource(t *testing.T) {
	src := "if a == b then\n  redis.call('DEL', KEYS[1])\nend\n"
	byID := map[string]string{}
	for _, m := range Mutants("s.lua", src) {
		byID[m.ID()] = m.Src
	}
	require.Equal(t, map[string]string{
		`s.lua:1:4 branch "a == b" -> "false"`:              "if false then\n  redis.call('DEL', KEYS[1])\nend\n",
		`s.lua:1:6 compare "==" -> "~="`:                    "if a ~= b then\n  redis.call('DEL', KEYS[1])\nend\n",
		`s.lua:2:3 call "redis.call('DEL', KEYS[1])" -> ""`: "if a == b then\n  \nend\n",
		`s.lua:2:26 constant "1" -> "2"`:                    "if a == b then\n  redis.call('DEL', KEYS[2])\nend\n",
	}, byID)
}
