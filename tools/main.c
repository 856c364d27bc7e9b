/* veloxquant: the command-line tool. */
#include "veloxquant.h"

#include <stdio.h>
#include <string.h>

int vq_cmd_bench_attn(int argc, char **argv);
int vq_cmd_generate(int argc, char **argv);
int vq_cmd_ppl(int argc, char **argv);
int vq_cmd_info(int argc, char **argv);
int vq_cmd_bench_gen(int argc, char **argv);
int vq_cmd_calibrate(int argc, char **argv);

static void usage(FILE *f) {
    fprintf(f,
            "veloxquant %s - compressed KV cache for transformer language models\n"
            "\n"
            "usage:\n"
            "  veloxquant generate -m DIR (-p TEXT | -f FILE) [-n N] [--kv SPEC] [--temp T] [--top-p P] [--seed S]\n"
            "                      [--threads T] [--chat [--system TEXT]]\n"
            "                                    generate text on the compressed cache (default -n 128,\n"
            "                                    --kv fp16, --temp 0.7, --top-p 0.9, --seed 42; --temp 0 = greedy);\n"
            "                                    --chat lays the prompt out with the model's chat template\n"
            "  veloxquant ppl -m DIR -f FILE [--ctx N] [--max-tokens N] [--kv SPEC] [--mode prefill|decode]\n"
            "                 [--ref fp16] [--threads T] [--json]\n"
            "                                    perplexity over non-overlapping windows of N tokens (default\n"
            "                                    512); --ref fp16 also reports KL(fp16||spec) and top-1 agreement\n"
            "  veloxquant info -m DIR [--kv SPEC] architecture, parameters, KV bytes per token\n"
            "  veloxquant calibrate qfilters -m DIR -f FILE -o FILTERS [--ctx N] [--windows N] [--max-tokens N]\n"
            "                 [--threads T] [--report VALFILE [--report-windows N]]\n"
            "  veloxquant calibrate qfilters -m DIR --filters FILTERS --report VALFILE [--ctx N] [--report-windows N]\n"
            "                                    Q-Filters (arXiv 2503.02812): per layer and kv head the first right\n"
            "                                    singular vector of the uncentered post-RoPE queries over --windows\n"
            "                                    windows of --ctx tokens of FILE (default 20 x 2048), for\n"
            "                                    'qfilters:filters=FILTERS'; --report: on VALFILE (default 4 windows),\n"
            "                                    Spearman correlation of <k, f> and of -|k| with the mean attention\n"
            "                                    each key receives\n"
            "  veloxquant bench attn [options]   decode attention: a KV spec vs fp16, interleaved\n"
            "  veloxquant bench gen -m DIR [--kv SPEC] [--ctx N] [--decode N] [--runs R] [--threads T] [-f FILE] [--json]\n"
            "                                    model prefill and decode tokens/s at context N (default 4096,\n"
            "                                    64 decode steps, kivi:bits=2) vs fp16, interleaved\n"
            "  veloxquant help                   this text\n"
            "  veloxquant --version              version and CPU kernel level\n"
            "\n"
            "bench attn options:\n"
            "  --kv SPEC        KV spec (default kivi:bits=2), e.g. 'kivi:bits=4,group=32',\n"
            "                   'k=kivi:bits=4;v=kivi:bits=2', 'fp16'\n"
            "  --seq N          cached tokens per sequence (default 32768)\n"
            "  --heads HQ/HKV   query / kv heads (default 32/8)\n"
            "  --dim D          head dim (default 128)\n"
            "  --batch B        sequences per step (default 1)\n"
            "  --threads T      threads (default: all cores)\n"
            "  --runs R         timed runs per arm (default 15)\n"
            "  --cpu LEVEL      kernel level: auto, scalar, avx2 (default auto)\n"
            "  --json           also print one JSON object on the last line\n"
            "\n"
            "KV specs: METHOD[:key=value,...] or k=METHOD[:...];v=METHOD[:...]\n"
            "  fp16                       no compression\n"
            "  kivi:bits=B,group=G,residual=R\n"
            "                             KIVI (arXiv 2402.02750): B in {2,3,4,8} (default 2),\n"
            "                             G in {32,64,128} (default 32), R in [0,4096] fp16\n"
            "                             tokens (default 128)\n",
            vq_version());
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("veloxquant %s (cpu: %s)\n", vq_version(), vq_cpu_level_name(vq_cpu_detect()));
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "generate")) return vq_cmd_generate(argc - 2, argv + 2);
    if (!strcmp(cmd, "ppl")) return vq_cmd_ppl(argc - 2, argv + 2);
    if (!strcmp(cmd, "info")) return vq_cmd_info(argc - 2, argv + 2);
    if (!strcmp(cmd, "calibrate")) return vq_cmd_calibrate(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench")) {
        if (argc >= 3 && !strcmp(argv[2], "attn")) return vq_cmd_bench_attn(argc - 3, argv + 3);
        if (argc >= 3 && !strcmp(argv[2], "gen")) return vq_cmd_bench_gen(argc - 3, argv + 3);
        fprintf(stderr, "veloxquant bench: unknown benchmark '%s' (available: attn, gen)\n", argc >= 3 ? argv[2] : "");
        return 2;
    }
    fprintf(stderr, "veloxquant: unknown command '%s' (try 'veloxquant help')\n", cmd);
    return 2;
}
