#!/bin/bash
# Trains the small SentencePiece models of the tokenizer tests with Debian's spm_train on the
# King James Bible (public domain; Debian package bible-kjv) plus a few lines of mixed-script
# text, and converts them to Hugging Face tokenizer.json files with spm_to_hf.py.
# Run from the repository root:  bash core/text/testdata/make_sentencepiece.sh
#   spm_bpe/         BPE with byte fallback, Llama 2 settings (identity normalization, dummy
#                    prefix, whitespace kept): tokenizer.model only
#   spm_bpe_hf/      the same model as a Llama 2 ("legacy") tokenizer.json + tokenizer_config
#   spm_bpe_meta/    the same model as a newer Llama tokenizer.json (Metaspace pre-tokenizer)
#   spm_gemma/       BPE with byte fallback, no dummy prefix, two user-defined symbols (Gemma
#                    settings): tokenizer.model and a Gemma-style tokenizer.json, in two dirs
#   spm_unigram/     unigram, default normalization (nmt_nfkc), no byte fallback
set -euo pipefail
here=core/text/testdata
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

bible -f Gen1:1-Rev22:21 | sed -E 's/^[0-9A-Za-z]+[0-9]+:[0-9]+ //' > "$work/corpus.txt"
for _ in $(seq 300); do
  cat >> "$work/corpus.txt" <<'TEXT'
Café au lait, naïve résumé, déjà vu; Straße und Größe über alles.
Ελληνικά γράμματα και Русский язык, 日本語の文章と中文句子，한국어 문장입니다.
Numbers 0123456789 and symbols: @#$%^&*()[]{}<>/\|~`"'!? — “quoted” 😀 🎉
TEXT
done

common=(--input="$work/corpus.txt" --character_coverage=1.0 --num_threads=1
        --input_sentence_size=0 --shuffle_input_sentence=false --minloglevel=2)
llama=(--model_type=bpe --byte_fallback=true --normalization_rule_name=identity
       --remove_extra_whitespaces=false --split_digits=true --allow_whitespace_only_pieces=true)

mkdir -p "$here"/{spm_bpe,spm_bpe_hf,spm_bpe_meta,spm_gemma,spm_gemma_hf,spm_unigram}
spm_train "${common[@]}" "${llama[@]}" --vocab_size=1000 --model_prefix="$work/bpe"
spm_train "${common[@]}" "${llama[@]}" --vocab_size=800 --add_dummy_prefix=false \
  --user_defined_symbols='<start_of_turn>,<end_of_turn>' --model_prefix="$work/gemma"
spm_train "${common[@]}" --model_type=unigram --vocab_size=1000 --model_prefix="$work/unigram"

cp "$work/bpe.model" "$here/spm_bpe/tokenizer.model"
cp "$work/gemma.model" "$here/spm_gemma/tokenizer.model"
cp "$work/unigram.model" "$here/spm_unigram/tokenizer.model"
python3 "$here/spm_to_hf.py" --style=llama-legacy "$work/bpe.model" "$here/spm_bpe_hf"
python3 "$here/spm_to_hf.py" --style=llama-metaspace "$work/bpe.model" "$here/spm_bpe_meta"
python3 "$here/spm_to_hf.py" --style=gemma "$work/gemma.model" "$here/spm_gemma_hf"
ls -l "$here"/spm_*
