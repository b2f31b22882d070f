// Writes gpt2_cases.json: GPT-2 token ids of test strings from the reference JavaScript
// encoder of the npm package gpt-3-encoder@1.1.4 (a port of OpenAI's encoder.py).
//   cd /tmp && npm pack gpt-3-encoder@1.1.4 && tar xzf gpt-3-encoder-1.1.4.tgz
//   node core/testdata/tokenizers/make_gpt2_cases.js /tmp/package   # from the repo root
const fs = require('fs');
const path = require('path');
const {encode, decode} = require(path.resolve(process.argv[2] || '/tmp/package', 'Encoder.js'));

// JavaScript's \s differs from Unicode White_Space only in U+0085 and U+FEFF; neither is used.
const texts = [
  'Hello world',
  ' Hello',
  'Hello, world! How are you?',
  "I'm sure they're here; we've seen it, you'll see, he'd know, it's John's, don't.",
  "I'M LOUD 'S 'T",
  '   three leading spaces',
  'trailing spaces   ',
  'word          ten spaces',
  'tabs\t\tand\ttabs',
  'line one\nline two\n\nline four\r\nwindows\n',
  '\n\n\n',
  '    ',
  'The year 2024 had 1234567 events; pi is 3.14159.',
  '0 00 000 0000 00000',
  'naïve café résumé – “quotes” — ünïcödé',
  'Ελληνικά, русский, العربية, עברית, हिन्दी',
  '日本語のテキストと中文字符、한국어',
  'emoji 😀👍🏽🇫🇷 and 🤖!',
  'e\u0301 combining, A\u030a vs \u00c5',
  'mixed\u3000ideographic\u00a0nbsp\u2028line sep',
  'def f(x):\n    return x ** 2  # square\n',
  '<html><body class="a">Hi &amp; bye</body></html>',
  'snake_case camelCase kebab-case SCREAMING_CASE',
  '$100, 50% off, #hashtag @user ~tilde `code`',
  'superscript x² roman Ⅻ fraction ½ arabic ٣',
  'a',
  ' ',
  '!!!???...',
];
const cases = texts.map(text => {
  const ids = encode(text);
  if (decode(ids) !== text) throw new Error('round trip failed for ' + JSON.stringify(text));
  return {text, ids};
});
const out = path.join(__dirname, 'gpt2_cases.json');
fs.writeFileSync(out, '[\n' + cases.map(c => JSON.stringify(c)).join(',\n') + '\n]\n');
