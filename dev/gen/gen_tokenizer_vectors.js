#!/usr/bin/env node
// gen_tokenizer_vectors.js: reference GPT-2 token ids for test/test_tokenizer.c.
//
// The reference is js-tiktoken's "gpt2" encoding (an independent JS implementation of GPT-2's
// byte-level BPE: its own copy of the ranks, its own merge loop, the GPT-2 regex run by V8).
// Every case is also encoded by gpt-tokenizer (r50k_base) and gpt-3-encoder; the script stops if
// any of the three disagree, so a vector is only written where three implementations concur.
// "<|endoftext|>" in the text is encoded as ordinary text by all three (special tokens
// disallowed-check off, none allowed), as OpenAI's encoder.py does.
//
// Writes (run from anywhere; `cd dev/gen && npm ci` first):
//   test/data/tokenizer_vectors.txt   one case a line: category <TAB> hex of the UTF-8 text <TAB> ids
//   test/data/tokenizer_novel_ids.txt id count, FNV-1a 64 of the whole id stream and of each
//                                     4096-id block of test/data/tokenizer_novel.txt
'use strict';
const fs = require('fs');      // reading the novel, writing the vectors
const path = require('path');  // repo-relative paths
const { getEncoding } = require('js-tiktoken');            // the reference
const r50k = require('gpt-tokenizer/encoding/r50k_base');  // cross-check 1
const gpt3enc = require('gpt-3-encoder');                  // cross-check 2 (OpenAI's algorithm)

const root = path.join(__dirname, '..', '..');
const tiktoken = getEncoding('gpt2');
const noSpecial = new Set();

function encodeChecked(text) {
  const ref = tiktoken.encode(text, [], []);
  const a = r50k.encode(text, { disallowedSpecial: noSpecial });
  const b = gpt3enc.encode(text);
  const same = (x) => x.length === ref.length && x.every((v, i) => v === ref[i]);
  if (!same(a) || !same(b)) {
    throw new Error(`reference encoders disagree on ${JSON.stringify(text)}:\n` +
      ` js-tiktoken ${ref.join(' ')}\n gpt-tokenizer ${a.join(' ')}\n gpt-3-encoder ${b.join(' ')}`);
  }
  return ref;
}

// Seeded PRNG (mulberry32) so the random cases are the same on every run.
let seed = 0x5EED1234;
function rand() {
  seed = (seed + 0x6D2B79F5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (arr) => arr[Math.floor(rand() * arr.length)];
const randInt = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const cp = (c) => String.fromCodePoint(c);
const range = (a, b) => { const r = []; for (let c = a; c <= b; c++) r.push(cp(c)); return r; };

const cases = [];  // [category, text]
const add = (cat, ...texts) => { for (const t of texts) cases.push([cat, t]); };

// --- hand-written cases -----------------------------------------------------------------------
add('empty', '');
add('basic', 'Hello', 'Hello world', 'hello world', 'HELLO WORLD', 'Hello, world!', 'a', ' ', 'x y z',
    'The quick brown fox jumps over the lazy dog.', 'GPT-2 is a language model.', 'tokenization');
add('spaces', ' hello', '  hello', '   hello', 'hello ', 'hello  ', 'hello   ', ' hello ', '  ', '   ',
    'a  b', 'a   b', 'a    b', ' 1', '  1', ' !', '  !', 'end.  ', ' \n', '\n ', ' \n ', 'a \nb',
    'a  \n  b', ' '.repeat(17), 'x' + ' '.repeat(9) + 'y');
add('tabs_newlines', '\t', '\tx', 'a\tb', 'a\t\tb', '\t\t', '\n', '\n\n', '\n\n\n', 'a\nb', 'a\n\nb',
    'a\r\nb', '\r\n', '\r\n\r\n', 'line1\r\nline2\r\n', '\r', 'a\rb', '\v\f', 'a\u000Bb\u000Cc',
    'para one.\n\nPara two.\n', '\n\tindented', ' \t \n', 'a \t b');
add('contractions', "it's", "don't", "we're", "I've", "I'm", "you'll", "he'd", "It's", "IT'S",
    "DON'T", "We'RE", "I'M", "You'LL", "He'D", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S",
    "'x", "'", "''", "'''s", "rock'n'roll", "'said", "'tis", "o'clock", "dogs'", "the dogs' bone",
    "it\u2019s", "don\u2019t", "\u2018quoted\u2019", "\u201Cdouble\u201D", " 's", "  'll", "x's's",
    "he said 'hello'", "can't've", "y'all'd've");
add('digits', '0', '1', '12', '123', '1234', '12345', '123456789', '1234567890123456789012345',
    '3.14159', '1,000,000', '-42', '+1', '1e10', '0x1F', '2023-11-29', '10:30', '$100', '50%',
    'abc123', '123abc', 'a1b2c3', ' 123', '  123', '١٢٣', '١٢٣ ٤٥٦', '\u0966\u0967\u0968', '½ ¼',
    '²³', 'Ⅻ', '①②', '３４５', '𝟙𝟚');
add('punctuation', '!', '!!', '!!!', '...', '?!', '.,;:', '()', '[]{}', '<>', '---', '***', '###',
    '!@#$%^&*()', ' !@#', '"quoted"', '(parens)', 'a.b.c', 'e.g.', 'i.e.,', '--flag', '->', '=>',
    '!==', '&&', '||', '...and', 'wait...what?!', '\u2014dash\u2014', '\u2026', '\u00BF\u00A1',
    '\u00AB\u00BB', '\u3002\u3001', '!\'s', "?'t");
add('latin', 'naïve', 'café', 'résumé', 'Zürich', 'Ångström', 'señor', 'façade', 'Æsir', 'ß',
    'Straße', 'œuvre', 'Łódź', 'Dvořák', 'İstanbul', 'ﬁ ligature', 'ÀÁÂÃÄÅ', 'ñÑ', 'ǅ');
add('combining', 'e\u0301', 'cafe\u0301', 'a\u0300\u0301\u0302', 'n\u0303o', '\u0301', ' \u0301',
    'Z\u0351\u0352\u0353', 'x\u20DD', 'क्षि', '\u0915\u094D', 'e\u0301\u0301\u0301 e');
add('cjk', '日本語', '日本語のテキスト', '中文', '你好，世界', '한국어', '안녕하세요 세계', 'カタカナ', 'ひらがな',
    '東京 tokyo', '漢字123', '𠀀𠀁', '〇一二三', '　全角スペース　');
add('emoji', '😀', '😀😀', ' 😀', '👍🏽', '👨‍👩‍👧‍👦', '🏳️‍🌈', '🇺🇸', '🇺🇸🇯🇵', '❤️', '✨ sparkle',
    'I ❤ NY', '🎉🎊', 'a😀b', '🧑‍💻', '#️⃣', '😀 😀  😀');
add('greek_cyrillic', 'Ελληνικά', 'αβγδε', 'Ω ω', 'Привет мир', 'Москва', 'ЁЖЗ', 'Ѳѳ', 'Україна',
    'Σίσυφος', 'кириллица и latin');
add('scripts', 'مرحبا بالعالم', 'العربية', 'שלום עולם', 'עברית', 'नमस्ते दुनिया', 'हिन्दी', 'สวัสดีชาวโลก',
    'ภาษาไทย', 'ქართული', 'Հայերեն', 'ᚠᚢᚦ', 'ⴰⵣⵓⵍ', 'ሰላም', 'தமிழ்', 'বাংলা', '𐌰𐌱𐌲');
add('unicode_spaces', 'a\u00A0b', '\u00A0', '\u00A0\u00A0x', 'a\u2009b', 'a\u3000b', 'a\u2028b',
    'a\u2029b', 'a\uFEFFb', '\uFEFF', '\uFEFFhello', 'a\u0085b', 'a\u200Bb', 'a\u200Db', 'a\u202Fb',
    'a\u205Fb', 'a\u1680b', 'a\u180Eb', 'x\u2000\u2001\u2002y', ' \u00A0 ', '\u00A0 x', ' \u00A0x',
    'a\u001Cb', 'a\u001Fb', '\u2003\u2003word');
add('control', '\u0000', 'a\u0000b', '\u0001\u0002\u0003', '\u001B[31mred\u001B[0m', '\u007F',
    'a\u0080b', '\u009F', 'bell\u0007', '\b\b', '\u0000\u0000\u0000');
add('endoftext', '<|endoftext|>', 'Hello<|endoftext|>World', ' <|endoftext|> ',
    '<|endoftext|><|endoftext|>', '<|endoftext', 'endoftext|>', '<|fim_prefix|>', '<|im_start|>');
add('code', 'def foo(x):\n    return x + 1\n', 'int main(void) { return 0; }',
    'for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}', 'const x = () => { console.log("hi"); };',
    '#include <stdio.h>', '    if x:\n        pass', 'SELECT * FROM users WHERE id = 42;',
    '<div class="a">text</div>', '{"key": "value", "n": [1, 2, 3]}', 'x_y_z = snake_case + camelCase',
    'a->b->c', 'std::vector<int>', '$HOME/.bashrc', '// comment\n/* block */', '0b1010 | 0o17',
    'if (a != b && c >= d) return;', 'lambda x: x**2', '@decorator\ndef f(): ...');
add('urls', 'https://www.example.com/path?query=1&b=2#frag', 'http://localhost:8080/',
    'user@example.com', 'ftp://files.example.org/pub/file.tar.gz', 'www.google.com',
    'https://en.wikipedia.org/wiki/Byte_pair_encoding', 'C:\\Users\\name\\file.txt', '/usr/share/dict');
add('mixed', 'Hello мир 世界 🌍!', 'English, Français, 日本語, العربية', 'abcαβγабв', 'x²+y²=z²',
    'Price: €100 / £80 / ¥1000', 'Temp: 25°C', 'π ≈ 3.14', '∑∫∂√∞', 'A→B⇒C', 'naïve café 日本 🎉 1,234.5',
    'tab\tand\nnewline\r\nmix  of   spaces', 'ｆｕｌｌｗｉｄｔｈ', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢', '𝐁𝐨𝐥𝐝');
add('long', 'a'.repeat(1000), 'ab'.repeat(300), '1'.repeat(300), '!'.repeat(200), ' '.repeat(300),
    '\n'.repeat(100), 'abc '.repeat(200), 'Supercalifragilisticexpialidocious'.repeat(10),
    'x'.repeat(65), 'y'.repeat(64), 'hello'.repeat(13), 'é'.repeat(200), '日本'.repeat(100));
{  // long runs without spaces: the heap-based BPE path (pieces over 64 bytes)
  let letters = '', b64 = '', mixedRun = '';
  const alpha = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ';
  const b64a = alpha + '0123456789+/';
  for (let i = 0; i < 500; i++) letters += pick(alpha.split(''));
  for (let i = 0; i < 2000; i++) b64 += pick(b64a.split(''));
  for (let i = 0; i < 300; i++) mixedRun += pick(['a', 'e', 'th', 'in', 'é', 'ß', 'я', 'ing', 'qu']);
  add('long', letters, b64, mixedRun, letters.toLowerCase(), 'the'.repeat(150) + 'end');
}

// --- every white-space code point, and the edges of every letter / number range ----------------
{
  const spaces = [], edges = [];
  const isL = (c) => /\p{L}/u.test(cp(c)), isN = (c) => /\p{N}/u.test(cp(c)), isS = (c) => /\s/u.test(cp(c));
  for (let c = 0; c <= 0x10FFFF; c++) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    if (isS(c)) spaces.push(c);
  }
  for (const c of spaces) add('space_chars', `a${cp(c)}b`, `${cp(c)}${cp(c)}x`, ` ${cp(c)}1`);
  // class boundaries: code points whose class differs from the previous one
  let prev = 'o';
  const cls = (c) => (c >= 0xD800 && c <= 0xDFFF) ? 'o' : isL(c) ? 'L' : isN(c) ? 'N' : isS(c) ? 'S' : 'o';
  for (let c = 1; c <= 0x10FFFF; c++) {
    const k = cls(c);
    if (k !== prev) {
      if (!(c - 1 >= 0xD800 && c - 1 <= 0xDFFF)) edges.push(c - 1);
      if (!(c >= 0xD800 && c <= 0xDFFF)) edges.push(c);
      prev = k;
    }
  }
  const seps = [' ', '', 'a', '1', '.', ' x', "'s", '  '];
  for (let i = 0; i < edges.length; i += 8) {
    let s = '';
    for (const c of edges.slice(i, i + 8)) s += pick(seps) + cp(c) + (rand() < 0.5 ? cp(c) : '');
    add('class_edges', s);
  }
}

// --- seeded random strings of mixed Unicode ------------------------------------------------------
{
  const pools = [
    range(0x61, 0x7A), range(0x41, 0x5A), range(0x30, 0x39), ' !"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~'.split(''),
    [' ', ' ', ' ', '  ', '\n', '\t', '\r\n', '\u00A0', '\u3000', '\uFEFF', '\u2009'],
    ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", '\u2019s'],
    range(0xC0, 0xFF), range(0x391, 0x3C9), range(0x410, 0x44F), range(0x4E00, 0x4E40),
    range(0x3040, 0x309F), range(0xAC00, 0xAC40), range(0x600, 0x6FF), range(0x5D0, 0x5EA),
    range(0x900, 0x97F), range(0xE00, 0xE7F), range(0x300, 0x36F), range(0x1F600, 0x1F64F),
    ['\u200D', '\uFE0F', '\u{1F3FB}', '\u{1F1FA}\u{1F1F8}'], range(0x0, 0x1F), range(0x2000, 0x206F),
    ['<|endoftext|>', 'the', ' the', 'ing', 'tion', '123', 'http://', '://'],
  ];
  const anyCodePoint = () => {
    for (;;) {
      const c = rand() < 0.7 ? randInt(0, 0xFFFF) : randInt(0x10000, 0x10FFFF);
      if (c < 0xD800 || c > 0xDFFF) return cp(c);
    }
  };
  for (let n = 0; n < 400; n++) {
    const len = randInt(1, n < 300 ? 24 : 120);
    let s = '';
    for (let i = 0; i < len; i++) s += rand() < 0.15 ? anyCodePoint() : pick(pick(pools));
    add('random', s);
  }
}

// --- write the vectors ----------------------------------------------------------------------------
const versionOf = (pkg) =>  // some packages do not export their package.json
  JSON.parse(fs.readFileSync(path.join(__dirname, 'node_modules', pkg, 'package.json'), 'utf8')).version;
const hex = (s) => Buffer.from(s, 'utf8').toString('hex');
let out = '# GPT-2 tokenizer reference vectors: GENERATED by dev/gen/gen_tokenizer_vectors.js.\n';
out += `# Reference: js-tiktoken ${versionOf('js-tiktoken')} "gpt2", checked ` +
       `against gpt-tokenizer ${versionOf('gpt-tokenizer')} r50k_base and ` +
       `gpt-3-encoder ${versionOf('gpt-3-encoder')}.\n`;
out += `# Node ${process.versions.node}, Unicode ${process.versions.unicode}.\n`;
out += '# Format: category <TAB> UTF-8 bytes of the text in hex <TAB> ids separated by spaces.\n';
for (const [cat, text] of cases) out += `${cat}\t${hex(text)}\t${encodeChecked(text).join(' ')}\n`;
fs.writeFileSync(path.join(root, 'test/data/tokenizer_vectors.txt'), out);
console.log(`wrote ${cases.length} cases`);

// --- the novel: compact checksum form --------------------------------------------------------------
function fnv64(ids) {  // FNV-1a 64 over the ids as 4 little-endian bytes each
  let h = 0xcbf29ce484222325n;
  const p = 0x100000001b3n, m = (1n << 64n) - 1n;
  for (const id of ids) for (let k = 0; k < 4; k++) h = ((h ^ BigInt((id >>> (8 * k)) & 255)) * p) & m;
  return h.toString(16).padStart(16, '0');
}
const novel = fs.readFileSync(path.join(root, 'test/data/tokenizer_novel.txt'), 'utf8');
const ids = encodeChecked(novel);
const BLOCK = 4096;
let nv = '# GENERATED by dev/gen/gen_tokenizer_vectors.js: GPT-2 ids of test/data/tokenizer_novel.txt\n';
nv += '# (js-tiktoken "gpt2"). FNV-1a 64 over the ids as 4 little-endian bytes each.\n';
nv += '# The text: "Pride and Prejudice" by Jane Austen (1813, public domain), the Project Gutenberg\n';
nv += '# text as shipped by the Debian package r-cran-janeaustenr 1.0.0-1 (data/Rdata.rdb, the\n';
nv += '# prideprejudice vector; its lines joined with "\\n", one "\\n" at the end).\n';
nv += `count ${ids.length}\nfnv64 ${fnv64(ids)}\nblock_size ${BLOCK}\n`;
for (let b = 0; b * BLOCK < ids.length; b++) nv += `block ${b} ${fnv64(ids.slice(b * BLOCK, (b + 1) * BLOCK))}\n`;
fs.writeFileSync(path.join(root, 'test/data/tokenizer_novel_ids.txt'), nv);
console.log(`novel: ${novel.length} chars, ${ids.length} ids`);
