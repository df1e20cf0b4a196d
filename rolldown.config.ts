import { defineConfig } from 'rolldown';

/**
 * The `tollgate` command as it ships: cmd/tollgate.ts and everything it imports, dependencies included,
 * in one entry file and a few chunks that load when their command needs them (the operator, the
 * embedded database, tracing, Stripe). A process loads about 20 files instead of ~1 300 modules, which
 * keeps about 20 MB less resident (docs/benchmarks.md, "One file to load"). Compressed, with names kept:
 * a stack trace still names its functions (`node --enable-source-maps` maps it back to src/).
 */
export default defineConfig({
  input: { tollgate: 'cmd/tollgate.ts' },
  platform: 'node',
  // PGlite loads its WebAssembly and data files from beside its own module.
  external: [/^@electric-sql\/pglite(\/|$)/],
  output: {
    dir: 'dist/bin',
    format: 'esm',
    sourcemap: true,
    minify: { compress: true, mangle: false, codegen: { removeWhitespace: true } },
    entryFileNames: '[name].js',
    chunkFileNames: 'chunks/[name]-[hash].js',
  },
});

/**
 * What the bundle still reads at run time, from node_modules and one data file — all the image keeps of them (Dockerfile),
 * and all the tests' bundle gets (test/helpers/bundle.ts), so a missing entry fails there first.
 */
export const runtimeFiles = [
  // external (above): `tollgate dev`'s embedded Postgres
  'node_modules/@electric-sql/pglite',
  // src/tokens/count.ts resolves the o200k table through the package's exports
  'node_modules/gpt-tokenizer/package.json',
  'node_modules/gpt-tokenizer/data/o200k_base.tiktoken',
  // src/core/yaml.ts loads it on first use (pricing and resource files of the CLI)
  'node_modules/yaml',
  // src/admin/common-passwords.ts reads the list sign-up refuses on first use
  'src/admin/common-passwords.txt',
];
