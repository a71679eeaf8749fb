/*
 * commands.c — the dispatch table of `strait`. A new subcommand is one row
 * here and one cmd_* function in its own file; main.c never changes.
 * Multi-word names ("site enroll") are matched word by word, longest first.
 */
#include <stddef.h>

#include "cli.h"

const Command cli_commands[] = {
    {"init",
     "DIR [--name NAME] [--listen HOST:PORT] [--advertise HOST:PORT]\n"
     "     [--model PRESET | --init-from HFDIR|FILE.gguf] [--recipe NAME] [--force]\n"
     "     [--lora-rank R [--lora-alpha A] [--lora-targets q,v]]",
     "create a federation: CA, coordinator and admin certificates, federation.ini, the store",
     "Keys are written 0600. An existing federation is kept unless --force.\n\n"
     "flags:\n"
     "  --name NAME            federation name (default: the folder's name)\n"
     "  --listen HOST:PORT     where the coordinator listens (default 0.0.0.0:7700)\n"
     "  --advertise HOST:PORT  the address sites use (default: the listen address);\n"
     "                         its host goes into the coordinator's certificate\n"
     "  --model PRESET         {presets}\n"
     "                         (their shapes, random weights); default small\n"
     "  --init-from HFDIR      round 0 starts from a pretrained Hugging Face folder\n"
     "                         (config.json, model.safetensors) or a GGUF file (FILE.gguf,\n"
     "                         llama.cpp's): its shapes are checked, it\n"
     "                         is copied into DIR/model/ and its SHA-256 recorded\n"
     "  --recipe NAME          {recipes}: codecs and outer optimizer\n"
     "                         together (federation.ini [recipe]); default diloco\n"
     "  --lora-rank R          fine-tune low-rank adapters (LoRA) of rank R over the\n"
     "                         model, frozen (the Llama family): only they train and\n"
     "                         travel; each site gives the same base with --init-from\n"
     "  --lora-alpha A         their output is scaled by A / R (default R)\n"
     "  --lora-targets T       the projections adapted, of {lora-targets}\n"
     "                         (default q,v)\n"
     "  --lora-rule R          ffa (default): A stays at its draw from the seed and only\n"
     "                         B trains and travels, averaged exactly (FFA-LoRA); fedsb:\n"
     "                         A and B stay at their draws, only the R x R between them\n"
     "                         trains, averaged exactly (Fed-SB); fedit: A and B both,\n"
     "                         averaged apart (not exact)\n"
     "  --lora-base-dtype D    bf16 (default): the base's matrices held and multiplied in\n"
     "                         bf16, sums in fp32 (oneDNN, AMX where the CPU has it);\n"
     "                         f32: all in fp32\n"
     "  --lora-dropout P       in training, a fraction P of each adapter's input is zeroed\n"
     "                         and the rest scaled by 1 / (1 - P), as PEFT's lora_dropout\n"
     "                         (default 0: none)\n"
     "  --force                replace an existing federation in DIR\n",
     cmd_init},
    {"coordinator start", "DIR", "run the coordinator of the federation in DIR",
     "Serves sites and admins over mutual TLS until SIGINT or SIGTERM.\n", cmd_coordinator_start},
    {"site enroll", "DIR NAME [--ttl 24h]",
     "issue a one-time token for a site and print the command it runs to join",
     "Only the token's SHA-256 is stored. NAME: 1-64 letters, digits, '-', '_', '.'.\n"
     "DIR is the federation folder, or an admin kit (then through the Admin API).\n\n"
     "flags:\n  --ttl DURATION   how long the token is valid (90m, 7d, ...; default: the\n"
     "                   federation's [security] token_ttl, 24h unless changed)\n",
     cmd_site_enroll},
    {"site join",
     "SITEDIR --name NAME --coordinator HOST:PORT [--join HOST:PORT] --token T --ca-sha256 FP",
     "join a federation: make the site's key here, send a CSR with the token",
     "The coordinator's CA is pinned by FP; any other CA is refused. The CSR goes to\n"
     "the coordinator's enrollment port (--join; default: the coordinator's host and\n"
     "its port plus one); every later call goes to --coordinator with the certificate.\n"
     "SITEDIR gets site.key (0600), site.crt, ca.crt and site.ini.\n",
     cmd_site_join},
    {"site hello", "SITEDIR [--json]", "greet the coordinator with the site's certificate",
     "Shows the federation and the name the coordinator knows this site by.\n", cmd_site_hello},
    {"site renew", "SITEDIR", "replace the site's key and certificate before they expire",
     "A new key is made here; the coordinator signs it for the same site.\n", cmd_site_renew},
    {"site run",
     "SITEDIR --data PATH... [--threads N] [--batch B] [--seq T] [--lr X] [--device cpu|cuda] "
     "[--gpus N] [--matmul tf32|fp32] [--seed S] [--init-from HFDIR] [--max-memory BYTES] "
     "[--moments fp32|bf16] [--base-blocks on|off] [--zero 1|0] [--precision fp32|bf16] "
     "[--recompute 0|1|2] [--tensorboard DIR] [--min-noise Z]",
     "train at the site, round after round, until the federation finishes",
     "Each round: the coordinator's model, H local AdamW steps (H from the federation),\n"
     "the compressed difference sent back. Transient failures are retried with backoff.\n\n"
     "flags:\n"
     "  --data PATH   the site's own training data: a text or token file, or a folder of\n"
     "                tokens_*.bin shards (strait tokenize --out); repeat for more\n"
     "  --threads N   CPU threads (default: all)\n"
     "  --batch B     sequences per step (default 8)\n"
     "  --seq T       tokens per sequence (default: min(model context, 128))\n"
     "  --lr X        inner learning rate (default 3e-3)\n"
     "  --device D    cpu (default) or cuda (a build with CUDA)\n"
     "  --gpus N      with cuda: data-parallel replicas over N GPUs (NCCL), each taking\n"
     "                its own batch of B x T (default 1)\n"
     "  --matmul M    with cuda: tf32 (default; tensor cores, as llm.c) or fp32\n"
     "  --init-from HFDIR  the pretrained folder (or GGUF file) the federation started from:\n"
     "                round 0 is built from it when its SHA-256 matches, not downloaded\n"
     "  --max-memory BYTES  the most memory the site may take (16G, 512M); a federation\n"
     "                whose model needs more is refused before anything is allocated\n"
     "                (default: what the machine has available)\n"
     "  --moments M   AdamW's moments in fp32 (default) or bf16 (CPU: 12 bytes a parameter\n"
     "                instead of 16; the model and its updates stay fp32)\n"
     "  --base-blocks on|off  with adapters over a quantized GGUF base (--init-from): on\n"
     "                (default) keeps its projections in the file's blocks, unpacked at\n"
     "                each use; off holds a bf16 copy (faster, more memory; the same values)\n"
     "  --zero 1|0    with ranks on CPUs (mpirun) or several GPUs: each keeps its share\n"
     "                of AdamW's moments and updates that share of the model (1, the\n"
     "                default: ZeRO-1; on CPUs the same steps bit for bit) or all (0)\n"
     "  --precision P fp32 (default) or bf16: on a CPU with bf16 instructions or a\n"
     "                GPU (compute capability 8.0+), the matmuls' products in bf16 with\n"
     "                fp32 sums (the model, its updates and AdamW stay fp32)\n"
     "  --recompute K what each layer's backward computes again instead of keeping:\n"
     "                0 nothing, 1 the MLP's activation (default), 2 also the norms'\n"
     "                outputs; the same steps bit for bit\n"
     "  --tensorboard DIR  TensorBoard's event file, a new one each run in DIR: each\n"
     "                step's train/loss, train/learning_rate, train/grad_norm and\n"
     "                train/tokens_per_second (at the site's step count), and each round's\n"
     "                round/eval_loss_before, round/eval_loss_after, round/train_loss,\n"
     "                round/steps (train/grad_norm on CPUs only)\n"
     "  --min-noise Z this site's own floor on privacy: it sends updates only under secure\n"
     "                aggregation with distributed DP at a noise multiplier of Z or more,\n"
     "                and exits saying so when its coordinator asks for less\n"
     "  --seed S      the order the site reads its data in (default: from the clock);\n"
     "                with a federation's fixed model seed, a run that repeats\n",
     cmd_site_run},
    {"site list", "DIR [--json]",
     "list the sites: state, online, enrolled, last seen, certificate expiry",
     "DIR is the federation folder or an admin kit; read through the Admin API.\n\n"
     "flags:\n  --json    one JSON object per site\n",
     cmd_site_list},
    {"site revoke", "DIR NAME",
     "revoke a site: every call with its certificates is refused from now on",
     "DIR is the federation folder, or an admin kit (then through the Admin API).\n",
     cmd_site_revoke},
    {"train",
     "--data PATH... [--model PRESET | --init-from HFDIR|FILE.gguf] [--steps N] [--batch B]\n"
     "     [--seq T] [--lr X] [--device cpu|cuda] [--gpus N] [--matmul tf32|fp32]\n"
     "     [--moments fp32|bf16] [--lora-rank R [--lora-alpha A] [--lora-targets q,v]]\n"
     "     [--adapters PEFTDIR] [--base-blocks on|off] [--precision fp32|bf16]\n"
     "     [--recompute 0|1|2] [--zero 1|0] [--out CKPT] [--tensorboard DIR]",
     "train a model on local data, without federation (the baseline)",
     "Text files become byte tokens (vocabulary 256); llm.c .bin shards ('strait tokenize')\n"
     "keep their BPE ids, and a preset then takes GPT-2's vocabulary (50257) unless --vocab\n"
     "says. The last 10% of the data is held out for validation.\n\n"
     "flags:\n"
     "  --data PATH       training data: text or token files, or a folder of tokens_*.bin\n"
     "                    shards (strait tokenize --out); repeat for more\n"
     "  --model PRESET    {presets}\n"
     "                    (default small)\n"
     "  --init-from DIR   start from a Hugging Face folder (config.json and\n"
     "                    model.safetensors; F32, F16 or BF16) or a GGUF file (llama,\n"
     "                    qwen2; F32 to Q4_K, Q5_K, Q6_K) instead of a preset\n"
     "  --vocab N         the model's vocabulary: the tokenizer's size for shards made\n"
     "                    with a BPE other than GPT-2's (default 256 text, 50257 shards)\n"
     "  --steps N         optimizer steps (default 1000)\n"
     "  --moments M       AdamW's moments in fp32 (default) or bf16 (CPU; 12 bytes a\n"
     "                    parameter instead of 16)\n"
     "  --precision P     fp32 (default) or bf16: on a CPU with bf16 instructions (AVX-512\n"
     "                    BF16, AMX) or GPUs (compute capability 8.0+), the matmuls' and\n"
     "                    the classifier's products in bf16 with fp32 sums; parameters,\n"
     "                    gradients, norms and AdamW stay fp32\n"
     "  --recompute K     what each layer's backward computes again instead of keeping:\n"
     "                    0 nothing, 1 the MLP's activation (default, as llm.c), 2 also\n"
     "                    the norms' outputs; the same steps bit for bit, less memory\n"
     "  --zero 1|0        with --gpus N > 1: each GPU keeps its share of AdamW's moments\n"
     "                    and updates that share (1, the default: ZeRO-1) or all (0)\n"
     "  --batch B         sequences per step (default 8)\n"
     "  --seq T           tokens per sequence (default: the model's context)\n"
     "  --lr X            peak learning rate, after warmup, decayed by cosine (default 3e-3)\n"
     "  --threads N       CPU threads for OpenMP and OpenBLAS (default: all)\n"
     "  --device D        cpu (default) or cuda\n"
     "  --gpus N          with cuda: data-parallel replicas over N GPUs (NCCL), each\n"
     "                    taking its own batch of B x T (default 1)\n"
     "  --matmul M        with cuda: tf32 (default; tensor cores, as llm.c) or fp32\n"
     "  --val-every K     validation loss every K steps (default 100)\n"
     "  --tensorboard DIR TensorBoard's event file, a new one each run in DIR: each\n"
     "                    step's train/loss, train/learning_rate, train/grad_norm,\n"
     "                    train/tokens_per_second (the run's mean so far), and eval/loss\n"
     "                    where it validates (train/grad_norm on CPUs only)\n"
     "  --seed S          initialisation and data order (default 1)\n"
     "  --lora-rank R     fine-tune low-rank adapters (LoRA) of rank R over the model,\n"
     "                    frozen (the Llama family); --out then holds the adapters\n"
     "  --lora-alpha A    their output is scaled by A / R (PEFT's lora_alpha; default R)\n"
     "  --lora-targets T  the projections adapted, of {lora-targets}\n"
     "                    (default q,v, as PEFT)\n"
     "  --lora-rule R     fedit (default): A and B train, as PEFT; ffa: A stays at its\n"
     "                    draw, only B trains (FFA-LoRA); fedsb: only the R x R between\n"
     "                    a frozen A and B (Fed-SB)\n"
     "  --lora-base-dtype D\n"
     "                    bf16 (default): the base's matmuls in bf16, sums in fp32;\n"
     "                    f32: all in fp32 (a PEFT folder from --adapters: f32)\n"
     "  --lora-dropout P  a fraction P of each adapter's input zeroed in training (PEFT's\n"
     "                    lora_dropout; default 0, or the --adapters folder's)\n"
     "  --base-blocks on|off  adapters over a quantized GGUF: on (default) keeps its\n"
     "                    projections in the file's blocks, unpacked at each use; off\n"
     "                    holds a bf16 copy (faster, more memory; the same values)\n"
     "  --adapters DIR    go on from a PEFT adapter folder (adapter_config.json and\n"
     "                    adapter_model.safetensors) over --init-from, its base\n"
     "  --out CKPT        write the model (safetensors) and optimizer state at the end\n"
     "  --json            one JSON object per logged step on stdout\n",
     cmd_train},
    {"sample",
     "CKPT [--tokenizer DIR] [--prompt TEXT] [--tokens N] [--temperature X] [--seed S]\n"
     "     [--base PATH]",
     "generate text from a model checkpoint",
     "A byte-level model (vocabulary 256) needs no tokenizer; a BPE model needs its own\n"
     "(the tokenizer.json, or vocab.json and merges.txt, it was tokenized with).\n\n"
     "flags:\n"
     "  --tokenizer DIR     DIR/tokenizer.json, else DIR/vocab.json and DIR/merges.txt\n"
     "  --vocab F, --merges F  the two files by name instead\n"
     "  --prompt TEXT       text to continue (default: a newline, or <|endoftext|>)\n"
     "  --tokens N          tokens to generate (default 200)\n"
     "  --temperature X     0 picks the likeliest token; 1 samples as trained (default 1)\n"
     "  --seed S            sampling seed (default 1)\n"
     "  --base PATH         for a checkpoint of adapters: the base they were trained over\n"
     "                      (a GGUF file or Hugging Face folder)\n",
     cmd_sample},
    {"tokenize", "--tokenizer DIR | --vocab F --merges F  FILE... --out DIR",
     "turn text files into byte-level BPE token shards (.bin) for 'strait train'",
     "Byte-level BPE as GPT-2's, Llama 3's and Qwen2's tokenizers: the pre-tokenization\n"
     "pattern (PCRE2), then the merges in rank order, the ids PyPI's tokenizers gives.\n"
     "Each FILE is one document and starts with <|begin_of_text|>, else <|endoftext|>,\n"
     "when the vocabulary has it; text that spells a special token stays text. Writes\n"
     "DIR/tokens_000000.bin, ... (header 20240520; version 1, llm.c's, uint16 ids, when\n"
     "every id fits; version 2, uint32 ids, for larger vocabularies).\n\n"
     "flags:\n"
     "  --tokenizer DIR     DIR/tokenizer.json, else DIR/vocab.json and DIR/merges.txt\n"
     "  --vocab F, --merges F  the two files by name instead\n"
     "  --out DIR           a new or empty folder for the shards\n"
     "  --shard-tokens N    tokens per shard (default 100000000, as llm.c's scripts)\n",
     cmd_tokenize},
    {"export",
     "CKPT --format hf|gguf|llmc|peft OUT [--dtype f32|bf16|f16|q8_0]\n"
     "     [--max-shard-size 5GB] [--tokenizer SRC] [--merge] [--base PATH]",
     "write a checkpoint in Hugging Face's, llama.cpp's (GGUF), llm.c's or PEFT's format",
     "CKPT is a Strait checkpoint: a federation's checkpoints/round-N.safetensors or the\n"
     "output of 'strait train --out'. A federation's round is held against retention\n"
     "([store] keep_last, keep_every) while it is read; a pruned one is refused. A GGUF\n"
     "file or a Hugging Face folder is converted whole, with its own tokenizer.\n\n"
     "flags:\n"
     "  --format hf     OUT is a folder transformers loads (AutoModelForCausalLM and\n"
     "                  AutoTokenizer): config.json, generation_config.json, the tensors\n"
     "                  (model.safetensors, or shards and model.safetensors.index.json)\n"
     "                  and the tokenizer's files, as GPT2LMHeadModel, LlamaForCausalLM or\n"
     "                  Qwen2ForCausalLM, as the model is\n"
     "  --format gguf   OUT is one GGUF file llama.cpp loads (the Llama family), with the\n"
     "                  tokenizer and chat template; norms and biases stay f32\n"
     "  --format llmc   OUT is one file in llm.c's checkpoint format (what train_gpt2.c\n"
     "                  loads: header version 3, fp32, tensors grouped across layers); GPT-2\n"
     "  --format peft   OUT is PEFT's LoRA adapter folder (adapter_config.json and\n"
     "                  adapter_model.safetensors) of a checkpoint of adapters, what\n"
     "                  PeftModel.from_pretrained loads over the base\n"
     "  --merge         hf, gguf: a checkpoint of adapters merged into its base\n"
     "                  (W + alpha/r B A); a pretrained base is --base's, a drawn one\n"
     "                  is drawn again from its seed\n"
     "  --base PATH     the base a checkpoint of adapters was trained over (a GGUF file or\n"
     "                  Hugging Face folder; checked by the fingerprint of its values); for\n"
     "                  peft, also adapter_config.json's base_model_name_or_path\n"
     "  --dtype D       f32 (default, the model as it is), bf16 or f16 (rounded to\n"
     "                  nearest, ties to even; config.json's torch_dtype says which); for\n"
     "                  gguf also q8_0 (llama.cpp's 8-bit blocks)\n"
     "  --max-shard-size N  hf: bytes of tensors a file holds at most: 5GB (default),\n"
     "                  500MB, 2GiB or a number of bytes\n"
     "  --tokenizer SRC where the tokenizer comes from: a Hugging Face folder (its files\n"
     "                  tokenizer.json, tokenizer_config.json, special_tokens_map.json,\n"
     "                  vocab.json, merges.txt, chat_template.jinja, generation_config.json\n"
     "                  and its bos/eos/pad ids) or a GGUF file (its tokenizer.ggml.* keys);\n"
     "                  a federation's round takes federation.ini's [model] source;\n"
     "                  none: no tokenizer\n",
     cmd_export},
    {"demo",
     "[--sites 3] [--rounds 20] [--model small] [--steps 50] [--recipe diloco] [--codec C]\n"
     "     [--non-iid] [--baseline] [--seed S] [--set SECTION.KEY=VALUE]... [--device D]\n"
     "     [--dir DIR] [--finetune [--base PATH] [--lr LR]]",
     "a whole federation on this machine: coordinator and sites over mutual TLS",
     "Creates a federation, enrolls and joins the sites, trains them on Debian's fortune\n"
     "collections (disjoint parts; --non-iid: English, German, Spanish, Italian), shows each\n"
     "round as it commits, then the validation loss, the bytes moved both ways against\n"
     "dense data-parallel training, and a sample from the final model. A site that stops\n"
     "early stops the demo, with that site's last log line.\n\n"
     "With --finetune it fine-tunes a pretrained model instead (by default the\n"
     "SmolLM2-135M-Instruct that 'make models' fetches): 4 sites, each one language's\n"
     "collections tokenized by the model's tokenizer, train rank-8 adapters on every\n"
     "projection; then each site's held-out loss before and after, the bytes of a round,\n"
     "the adapters for PEFT, the merged model as a GGUF, and a sample from the\n"
     "base and the merged model.\n\n"
     "flags:\n"
     "  --sites N      sites (default 3)\n"
     "  --rounds N     rounds (default 20)\n"
     "  --model M      {byte-presets} (default small)\n"
     "  --lora-rank R  fine-tune low-rank adapters of rank R over the model (the Llama\n"
     "                 family: llama-tiny), frozen; also --lora-alpha, --lora-targets,\n"
     "                 --lora-rule, --lora-base-dtype, --lora-dropout (strait help init)\n"
     "  --steps H      local steps per round (default 50)\n"
     "  --recipe R     {recipes} (default diloco; docs/tuning.md)\n"
     "  --codec C      override the recipe's uplink: {codecs}\n"
     "  --non-iid      one language per site instead of disjoint English collections\n"
     "  --baseline     then train one centralized model on all the sites' collections with\n"
     "                 the same tokens ('strait train'), and compare both on held-out text\n"
     "  --seed S       the sites read their data in a fixed order (site i: S + i)\n"
     "  --set S.K=V    write K = V in federation.ini's [S] before the coordinator starts\n"
     "                 (e.g. --set optimizer.lr=0.5 --set codec.downlink=lossless)\n"
     "  --device D     where the sites train: cpu (default) or cuda (every site on GPU 0)\n"
     "  --dir DIR      where the federation lives (default: a new folder in /tmp)\n"
     "  --finetune     fine-tune --base with adapters (defaults: 4 sites, 4 rounds of 15\n"
     "                 steps of 4 x 64 tokens, --lora-rank 8, --lora-alpha 16 on every\n"
     "                 projection, --lr 3e-3); --baseline then also runs the same\n"
     "                 federation training every parameter (lr 1e-3) and one\n"
     "                 centralized LoRA run on the sites' text interleaved, at equal tokens\n"
     "  --base PATH    the pretrained model (GGUF file or Hugging Face folder; default\n"
     "                 models/SmolLM2-135M-Instruct.Q4_1.gguf beside this program)\n"
     "  --lr LR        the sites' learning rate (default: site run's; 3e-3 fine-tuning)\n",
     cmd_demo},
    {"version", "[--json]",
     "print the version, the git commit, the build's capabilities and the GPUs",
     "flags:\n  --json    one JSON object instead of text\n", cmd_version},
    {"db check", "DIR [--json]",
     "check the federation's store: SQLite integrity and every committed checkpoint's SHA-256",
     "Read-only; safe to run beside a running coordinator. Exit status 1 when the\n"
     "database is damaged or a committed checkpoint it keeps is missing or altered;\n"
     "those retention pruned on purpose are counted, not checked.\n\n"
     "flags:\n  --json    one JSON object, with the bad checkpoints listed\n",
     cmd_db_check},
    {"db backup", "DIR FILE",
     "copy the federation's store to FILE while the coordinator runs (SQLite online backup)",
     "The copy is consistent (one snapshot), checked with integrity_check, and appears at\n"
     "FILE only when whole. FILE must not exist. Checkpoints are files in DIR/checkpoints:\n"
     "copy them before and after it, as retention removes old ones (docs/operations.md).\n",
     cmd_db_backup},
    {"rounds", "DIR [--last N] [--json] [--watch]",
     "the rounds: state, sites, tokens, losses, bytes both ways against dense, time, who missed",
     "DIR is a federation folder or an admin kit (strait admin export). Reads through the\n"
     "Admin API with the admin certificate; a stopped federation is read from its store.\n"
     "START, TRAIN and VAL are token-weighted means over the sites: the held-out loss of\n"
     "the global model the round started from (scored before training; with overlap, the\n"
     "model each site trained from: the round before's, moved by its look-ahead), the\n"
     "training loss of the inner steps, and the held-out loss of each site's model after\n"
     "them.\n"
     "MB UP counts the updates taken (refused ones are in NOTES), MB DOWN the models\n"
     "served; RATIO is the bytes dense data-parallel training would have moved for the\n"
     "same steps over MB UP + MB DOWN (docs/communication.md).\n\n"
     "flags:\n"
     "  --last N   the newest N round attempts (default 20)\n"
     "  --json     one JSON object per round attempt, oldest first\n"
     "  --watch    redraw once a second with a sparkline of the validation loss and an\n"
     "             ETA, until Ctrl-C (ANSI terminal; works over ssh)\n",
     cmd_rounds},
    {"status", "DIR [--json]",
     "the federation at a glance: coordinator, uptime, round, sites, last commit, bytes",
     "flags:\n  --json    one JSON object\n", cmd_status},
    {"round show", "DIR N [--json]",
     "every update of round N: site, codec, bytes, tokens, loss, times, accepted or why not",
     "flags:\n  --json    one JSON object per update\n", cmd_round_show},
    {"events", "DIR [--last N] [--json]",
     "the audit log: enrollments, joins, renewals, revocations, exports, with who did them",
     "flags:\n"
     "  --last N   the newest N events (default 50), shown oldest first\n"
     "  --json     one JSON object per event\n",
     cmd_events},
    {"report", "DIR --out FILE.html [--last N]",
     "the run as one HTML page of charts: losses, bytes against dense, time, refusals",
     "DIR is a federation folder or an admin kit, read as 'strait rounds' reads. The page\n"
     "is self-contained (inline SVG, no script, nothing fetched): it opens offline and can\n"
     "be attached to a message. Charts: the global, validation and training loss and each\n"
     "site's held-out loss by round; bytes up and down per round against dense\n"
     "data-parallel training; each round's wall time; each site's utilization; round\n"
     "commits, refused updates and revoked sites in time; then federation.ini. Every\n"
     "point carries its value (hover it).\n\n"
     "flags:\n"
     "  --out FILE   where the page goes (written beside and renamed)\n"
     "  --last N     the newest N round attempts (default: all)\n",
     cmd_report},
    {"admin export", "DIR OUT [--coordinator HOST:PORT]",
     "write an admin kit (CA, admin certificate and key, address) for another machine",
     "OUT gets ca.crt, admin.crt, admin.key (0600) and admin.ini; then 'strait rounds OUT',\n"
     "'strait status OUT', 'strait site list|enroll|revoke OUT ...' work from anywhere that\n"
     "reaches the coordinator.\n\n"
     "flags:\n"
     "  --coordinator HOST:PORT  the address to reach it by (default: the advertised one)\n",
     cmd_admin_export},
    {"help", "[COMMAND...]", "explain a command", "", cmd_help},
    {NULL, NULL, NULL, NULL, NULL},
};
