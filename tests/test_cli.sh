#!/usr/bin/env bash
# The veloxquant command line on the reference model: every command runs,
# JSON lines carry the documented keys, greedy generation is repeatable, and
# bad input gives an error naming the problem (exit code 1 or 2, no crash).
#   tests/test_cli.sh PATH_TO_veloxquant SOURCE_DIR
vq=$1
src=$2
model="$src/models/velox-ref"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*" >&2; }

# expect_ok NAME CMD...: exit 0
expect_ok() {
    local name=$1; shift
    if "$@" > "$tmp/out" 2> "$tmp/err"; then ok; else bad "$name: exit $? ($(tail -n 2 "$tmp/err"))"; fi
}

# expect_err NAME PATTERN CMD...: exit 1 or 2, stderr matches PATTERN
expect_err() {
    local name=$1 pattern=$2; shift 2
    "$@" > "$tmp/out" 2> "$tmp/err"
    local rc=$?
    if [ $rc -ne 1 ] && [ $rc -ne 2 ]; then bad "$name: exit $rc, want 1 or 2"; return; fi
    if grep -q -- "$pattern" "$tmp/err"; then ok; else bad "$name: stderr lacks '$pattern': $(cat "$tmp/err")"; fi
}

# json_has NAME KEY...: the last line of $tmp/out is a JSON object with these keys
json_has() {
    local name=$1; shift
    local line
    line=$(tail -n 1 "$tmp/out")
    case "$line" in "{"*"}") ;; *) bad "$name: last line is not a JSON object: $line"; return ;; esac
    for k in "$@"; do
        if ! printf '%s' "$line" | grep -q "\"$k\":"; then bad "$name: JSON lacks \"$k\""; return; fi
    done
    ok
}

expect_ok version "$vq" --version
grep -q "veloxquant" "$tmp/out" && ok || bad "version output"
expect_ok help "$vq" help
grep -q "bench attn" "$tmp/out" && ok || bad "help lists bench attn"

expect_ok info "$vq" info -m "$model" --kv kivi:bits=2
grep -q "LlamaForCausalLM" "$tmp/out" && grep -q "KV bytes/token" "$tmp/out" && ok || bad "info output"

expect_ok bench_attn "$vq" bench attn --kv kivi:bits=4 --seq 300 --heads 8/2 --dim 64 --runs 3 --threads 2 --json
json_has bench_attn spec seq heads_q heads_kv dim batch threads us_median us_min us_max fp16_us_median \
    fp16_us_min fp16_us_max speedup_vs_fp16 kv_bytes kv_bytes_fp16 rel_err_vs_fp16 gbps

head -c 6000 "$src/models/velox-ref/README.md" > "$tmp/text.txt"
expect_ok ppl "$vq" ppl -m "$model" -f "$tmp/text.txt" --ctx 64 --max-tokens 128 --kv kivi:bits=4,residual=16 \
    --ref fp16 --mode decode --threads 2 --json
json_has ppl ppl ppl_ref tokens ctx mode spec kv_bytes kv_bytes_fp16 kl top1_agree tokens_per_s
expect_ok ppl_prefill "$vq" ppl -m "$model" -f "$tmp/text.txt" --ctx 64 --max-tokens 128 --kv tq-mse:bits=3 --json
json_has ppl_prefill ppl tokens ctx mode spec kv_bytes

expect_ok generate "$vq" generate -m "$model" -p "The kernel" -n 12 --temp 0 --kv kivi:bits=4 --threads 2
cp "$tmp/out" "$tmp/gen1"
grep -q "KV cache" "$tmp/err" && grep -q "tokens/s" "$tmp/err" && ok || bad "generate stats on stderr"
expect_ok generate_again "$vq" generate -m "$model" -p "The kernel" -n 12 --temp 0 --kv kivi:bits=4 --threads 1
cmp -s "$tmp/out" "$tmp/gen1" && ok || bad "greedy generation differs between runs / thread counts"
expect_ok generate_sampled "$vq" generate -m "$model" -p "The kernel" -n 8 --seed 3 --kv fp16

# --chat: the reference model ships no chat template, so it is refused;
# a copy of it with a chat_template.jinja renders the conversation, and the
# template's own BOS is not doubled (same token count as the plain prompt,
# to which the tokenizer adds BOS itself)
expect_err chat_no_template "has no chat template" "$vq" generate -m "$model" --chat -p "The kernel" -n 4
expect_err system_without_chat "--system needs --chat" "$vq" generate -m "$model" --system "Be brief." -p "x"
mkdir -p "$tmp/chat"
for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json; do
    ln -s "$(cd "$model" && pwd)/$f" "$tmp/chat/$f"
done
printf '%s' '{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content | trim }}
{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}' > "$tmp/chat/chat_template.jinja"
expect_ok chat "$vq" generate -m "$tmp/chat" --chat --system "Be brief. " -p "The kernel" -n 6 --temp 0 --threads 2
chat_tokens=$(grep -o 'prompt: [0-9]* tokens' "$tmp/err")
printf '<|bos|>system: Be brief.\nuser: The kernel\nassistant:' > "$tmp/chat_expected"
head -c "$(wc -c < "$tmp/chat_expected")" "$tmp/out" | cmp -s - "$tmp/chat_expected" && ok || bad "chat: rendered prompt: $(head -c 200 "$tmp/out")"
expect_ok chat_plain "$vq" generate -m "$model" -p "$(printf 'system: Be brief.\nuser: The kernel\nassistant:')" -n 6 --temp 0 --threads 2
[ -n "$chat_tokens" ] && [ "$chat_tokens" = "$(grep -o 'prompt: [0-9]* tokens' "$tmp/err")" ] && ok ||
    bad "chat prompt tokens '$chat_tokens' differ from the plain prompt's: $(grep -o 'prompt: [0-9]* tokens' "$tmp/err")"
printf '{%% for m in messages %%}{{ m.content | sort }}{%% endfor %%}' > "$tmp/chat/chat_template.jinja"
expect_err chat_unsupported "filter 'sort' is not supported" "$vq" generate -m "$tmp/chat" --chat -p "x" -n 2

expect_ok bench_gen "$vq" bench gen -m "$model" --ctx 96 --decode 8 --runs 1 --threads 2 --json
json_has bench_gen prefill_tps decode_tps fp16_decode_tps kv_bytes kv_bytes_fp16

# bad input
expect_err unknown_cmd "unknown command" "$vq" frobnicate
expect_err bad_spec "unknown method 'zstd'" "$vq" bench attn --kv zstd --seq 64
expect_err bad_bits "bits=5" "$vq" info -m "$model" --kv kivi:bits=5
expect_err bad_seq "out of range" "$vq" bench attn --seq 0
expect_err no_model "config.json" "$vq" info -m "$tmp/nowhere"
expect_err empty_prompt "empty" "$vq" generate -m "$model" -p ""
printf '' > "$tmp/empty.txt"
expect_err empty_file "empty" "$vq" generate -m "$model" -f "$tmp/empty.txt"
printf '\xff\xfe not utf-8' > "$tmp/bad.txt"
expect_err non_utf8 "UTF-8" "$vq" generate -m "$model" -f "$tmp/bad.txt"
expect_err ppl_short "fewer than one window" "$vq" ppl -m "$model" -f "$tmp/text.txt" --ctx 4096
expect_err long_prompt "context length" "$vq" generate -m "$model" -f "$src/models/velox-ref/stats.json" -n 10
expect_err bad_mode "--mode" "$vq" ppl -m "$model" -f "$tmp/text.txt" --mode sideways
# a truncated checkpoint
mkdir -p "$tmp/broken"
cp "$model/config.json" "$model/tokenizer.json" "$tmp/broken/"
head -c 100000 "$model/model.safetensors" > "$tmp/broken/model.safetensors"
expect_err truncated "model.safetensors" "$vq" generate -m "$tmp/broken" -p "x"
# a corrupt config
printf '{"architectures": ["LlamaForCausalLM"], "hidden_size": ' > "$tmp/broken/config.json"
expect_err bad_json "JSON" "$vq" info -m "$tmp/broken"
printf '{"architectures": ["GPT2LMHeadModel"]}' > "$tmp/broken/config.json"
expect_err other_arch "GPT2LMHeadModel" "$vq" info -m "$tmp/broken"

# calibrate qfilters: a small calibration gives the same file at any thread
# count, the report reads it back, and broken input is refused
expect_ok calibrate "$vq" calibrate qfilters -m "$model" -f "$tmp/text.txt" -o "$tmp/qf.bin" --ctx 64 --windows 2 --threads 2
expect_ok calibrate_1t "$vq" calibrate qfilters -m "$model" -f "$tmp/text.txt" -o "$tmp/qf1.bin" --ctx 64 --windows 2 --threads 1
cmp -s "$tmp/qf.bin" "$tmp/qf1.bin" && ok || bad "Q-Filters differ between thread counts"
expect_ok calibrate_report "$vq" calibrate qfilters -m "$model" --filters "$tmp/qf.bin" --report "$tmp/text.txt" --ctx 64 --report-windows 1
json_has calibrate_report qfilters_spearman knorm_spearman mean_qfilters mean_knorm
expect_err calibrate_no_out "give -o FILTERS" "$vq" calibrate qfilters -m "$model" -f "$tmp/text.txt"
expect_err calibrate_short "fewer than one window" "$vq" calibrate qfilters -m "$model" -f "$tmp/text.txt" -o "$tmp/qf2.bin" --ctx 4000
head -c 100 "$tmp/qf.bin" > "$tmp/qf_cut.bin"
expect_err calibrate_truncated "truncated" "$vq" calibrate qfilters -m "$model" --filters "$tmp/qf_cut.bin" --report "$tmp/text.txt" --ctx 64

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
