import type { FastifyRequest } from 'fastify';
import type { z } from 'zod';
import { ApiError } from '../core/errors.ts';
import { html, type Raw, raw } from '../html/index.ts';

/**
 * Forms that come back in place. A form the server refuses — its body does not validate (its zod
 * schema), or the service refuses a value of it (a 400 whose `param` names the field: "amount must be
 * positive", "Provider check failed") — is rendered again on its own page with a 400 and a fresh CSRF
 * token: what was typed kept in the fields (never a secret: keys, passwords and signing secrets are
 * typed again, a note says so), each problem beside its field (`aria-invalid`, `aria-describedby`), a
 * whole-form problem at the top of the form, the focus on the first field with a problem. Errors that
 * are not about the form's input (the project is gone, a conflict) stay the dashboard's error page.
 */

/** A form of a page: its name among the page's forms, its fields in the order shown. */
export interface FormSpec {
  name: string;
  /**
   * Field name → the id of its input and its label; `secret`: never sent back; `help`: the id of the
   * text that describes the field (kept in its `aria-describedby` beside its problem).
   */
  fields: Record<string, { id: string; label: string; secret?: boolean; help?: string }>;
  /** Names the service gives fields in its errors (`param`), when they differ: e.g. `id` → `model`. */
  params?: Record<string, string>;
}

/** A refused form: which one, what was typed (no secrets), the problems by field (`form`: the whole form). */
export interface Refused {
  form: string;
  values: Record<string, string>;
  errors: Record<string, string>;
}

const UNREADABLE = 'The form could not be read. Reload the page and try again.';

/** What was typed in the form's fields, secrets left out. */
function typedValues(spec: FormSpec, body: unknown): Record<string, string> {
  const values: Record<string, string> = {};
  for (const [name, field] of Object.entries(spec.fields)) {
    const value = (body as Record<string, unknown> | undefined)?.[name];
    if (!field.secret && typeof value === 'string') values[name] = value.slice(0, 2000);
  }
  return values;
}

/** `Amount must not be empty.` from a field's label and a schema's or service's message. */
function sentence(label: string, message: string): string {
  const said = /^[A-Z]/.test(message) ? `${label}: ${message}` : `${label} ${message}`;
  return /[.!?]$/.test(said) ? said : `${said}.`;
}

/** The problems in the form's field order (the first one gets the focus). */
function ordered(spec: FormSpec, errors: Record<string, string>): Record<string, string> {
  const out: Record<string, string> = {};
  if (errors.form) out.form = errors.form;
  for (const name of Object.keys(spec.fields)) if (errors[name]) out[name] = errors[name];
  return out;
}

/**
 * The refusal of a body that did not validate (a route with `attachValidation`): each field's first
 * problem, in words. A refused path or query is not the form's: it is thrown as it is.
 */
export function invalidBody(spec: FormSpec, schema: z.ZodType, request: FastifyRequest): Refused {
  const error = request.validationError as (Error & { validationContext?: string }) | undefined;
  if (!error) throw new Error('invalidBody: the request validated');
  if (error.validationContext !== 'body') throw error;
  const parsed = schema.safeParse(request.body);
  const errors: Record<string, string> = {};
  for (const issue of parsed.success ? [] : parsed.error.issues) {
    const name = issue.path[0];
    if (typeof name === 'string' && Object.hasOwn(spec.fields, name)) {
      const missing = issue.code === 'invalid_type' && /received undefined/i.test(issue.message);
      errors[name] ??= sentence(spec.fields[name]!.label, missing ? 'is required' : issue.message);
    } else errors.form ??= UNREADABLE;
  }
  if (!Object.keys(errors).length) errors.form = error.message;
  return { form: spec.name, values: typedValues(spec, request.body), errors: ordered(spec, errors) };
}

/** The form's field a service's error names (`param`: `settings.returnUrl`, `pricing.holdMargin`, `id`). */
function fieldOf(spec: FormSpec, param: string | null): string | undefined {
  if (!param) return undefined;
  const parts = param.split('.');
  for (const name of [param, ...parts.reverse()]) {
    const field = spec.params?.[name] ?? name;
    if (Object.hasOwn(spec.fields, field)) return field;
  }
  return undefined;
}

/**
 * A service's refusal of the form's input — a 400 or 422 about the request — beside the field it names,
 * else at the top of the form. Anything else (not found, a conflict, a failure) is thrown again.
 */
export function refusedBy(spec: FormSpec, err: unknown, body: unknown): Refused {
  if (!(err instanceof ApiError) || err.type !== 'invalid_request_error' || ![400, 422].includes(err.status))
    throw err;
  const field = fieldOf(spec, err.param);
  const rest = /^Invalid (?:'[^']*'|[\w.]+): (.*)$/s.exec(err.message)?.[1];
  const message = field ? (rest ? sentence(spec.fields[field]!.label, rest) : err.message) : err.message;
  return { form: spec.name, values: typedValues(spec, body), errors: { [field ?? 'form']: message } };
}

/** How one form of a page renders, refused or not. */
export interface FormView {
  /** True when this form was refused (and is shown again). */
  refused: boolean;
  /** The field's value: what was typed when refused, else `fallback`. */
  value(name: string, fallback?: string): string;
  /** An input's ` value="…"` and its problem's attributes. */
  input(name: string, fallback?: string): Raw;
  /** The attributes of a field's problem (a select's, a textarea's): aria-invalid, aria-describedby, autofocus. */
  invalid(name: string): Raw;
  /** ` selected` on the option `option` of the select `name` when it is the value (else when `fallback`). */
  selected(name: string, option: string, fallback: boolean): Raw;
  /** ` checked` on the checkbox `name` when it was ticked (else when `fallback`). */
  checked(name: string, fallback: boolean): Raw;
  /** The field's problem, below it (or, for a secret of a refused form, a note to type it again). */
  error(name: string): Raw;
  /**
   * The form's alert at its top: its whole-form problem (or that of a field not shown), or "Check the
   * fields marked below.".
   */
  alert(): Raw;
}

/**
 * The view of the form `spec` on a page, given the page's refused form (if any: a page may carry
 * several forms; only the refused one comes back with its values). `focus`: the field that has the
 * focus when nothing was refused.
 */
export function formView(spec: FormSpec, refused?: Refused, focus?: string): FormView {
  const mine = refused?.form === spec.name ? refused : undefined;
  const errors = mine?.errors ?? {};
  const first = Object.keys(spec.fields).find((name) => errors[name]);
  const autofocus = mine ? first : focus;
  const id = (name: string) => spec.fields[name]?.id ?? name;
  const secretNote = (name: string) => Boolean(mine && spec.fields[name]?.secret && !errors[name]);
  const view: FormView = {
    refused: Boolean(mine),
    value: (name, fallback = '') => (mine ? (mine.values[name] ?? '') : fallback),
    input: (name, fallback) => html` value="${view.value(name, fallback)}"${view.invalid(name)}`,
    invalid(name) {
      const described = [
        spec.fields[name]?.help,
        errors[name] ? `${id(name)}-error` : secretNote(name) ? `${id(name)}-note` : undefined,
      ]
        .filter(Boolean)
        .join(' ');
      return raw(
        `${errors[name] ? ' aria-invalid="true"' : ''}${described ? ` aria-describedby="${described}"` : ''}${autofocus === name ? ' autofocus' : ''}`,
      );
    },
    selected: (name, option, fallback) =>
      raw((mine ? mine.values[name] === option : fallback) ? ' selected' : ''),
    checked: (name, fallback) => raw((mine ? mine.values[name] === 'on' : fallback) ? ' checked' : ''),
    error(name) {
      if (errors[name]) return html`<p class="field-error" id="${id(name)}-error">${errors[name]}</p>`;
      if (secretNote(name))
        return html`<p class="muted" id="${id(name)}-note">Type it again: a secret is never sent back.</p>`;
      return raw('');
    },
    alert() {
      if (!mine) return raw('');
      // a problem of a field this page does not show (a hidden one) is the form's
      const unshown = Object.keys(errors).find((name) => !Object.hasOwn(spec.fields, name));
      const text = unshown ? errors[unshown] : 'Check the fields marked below.';
      return html`<p class="error" role="alert" id="${spec.name}-alert"${raw(first ? '' : ' tabindex="-1" autofocus')}>${text}</p>`;
    },
  };
  return view;
}
