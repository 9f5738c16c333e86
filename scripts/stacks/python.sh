# Which stack runs, on which Python: sourced by setup_env.sh, demo.sh and test.sh. Only bash builtins
# (and the interpreters it asks), so `scripts/demo.sh --which-stack` answers without installing anything.
#
# A stack is picked by the Python found for it (choose_stack): KERNEL_CACHE_STACK names one; else
# PYTHON=/path/to/python3.X picks the stack of its version (3.11 oldest, 3.12 current, 3.13
# current-py313); else the first stack of STACK_PREFERENCE whose Python is found on PATH or among
# pyenv's versions (CI has 3.12 there, not on PATH).

STACK_PREFERENCE="current current-py313 oldest"
ALL_STACKS="oldest current current-py313"

stack_python_version() {
  case "$1" in
    oldest) echo 3.11 ;;
    current) echo 3.12 ;;
    current-py313) echo 3.13 ;;
  esac
}

version_stack() {
  case "$1" in
    3.11) echo oldest ;;
    3.12) echo current ;;
    3.13) echo current-py313 ;;
  esac
}

# The "X.Y" of interpreter $1 (a name on PATH or a path), nothing when it does not run or has no venv module.
python_minor() {
  command -v "$1" >/dev/null 2>&1 && "$1" -c 'import sys, venv; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
}

# The interpreter for stack $1 ($PYTHON when it is that version), or nothing when this machine has none.
stack_python() {
  local want root candidate
  want="$(stack_python_version "$1")"
  root="$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
  for candidate in ${PYTHON:-} "python$want" "$root"/versions/"$want".*/bin/python; do
    if [ "$(python_minor "$candidate")" = "$want" ]; then
      command -v "$candidate"; return
    fi
  done
}

# The venv of stack $1 in checkout $2 (KERNEL_CACHE_VENV when set), as setup_env.sh makes it.
stack_venv() {
  if [ -n "${KERNEL_CACHE_VENV:-}" ]; then echo "$KERNEL_CACHE_VENV"
  elif [ "$1" = oldest ]; then echo "$2/.venv"
  else echo "$2/.venv-$1"
  fi
}

# Prints the stack to run (see the top); on a conflict or when no supported Python is found, says
# why on stderr (each line starting with $1, the caller's name) and returns 2.
choose_stack() {
  local who="${1:-}" minor stack
  if [ -n "${KERNEL_CACHE_STACK:-}" ] && [[ " $ALL_STACKS " != *" $KERNEL_CACHE_STACK "* ]]; then
    echo "${who}KERNEL_CACHE_STACK=$KERNEL_CACHE_STACK: no such stack (there are: $ALL_STACKS)" >&2; return 2
  fi
  if [ -n "${PYTHON:-}" ]; then
    minor="$(python_minor "$PYTHON")"
    if [ -z "$minor" ]; then
      echo "${who}PYTHON=$PYTHON: not a Python that runs here with its venv module (a pyenv shim runs only its selected versions: name the interpreter's path)" >&2; return 2
    fi
    stack="$(version_stack "$minor")"
    if [ -z "$stack" ]; then
      echo "${who}PYTHON=$PYTHON is Python $minor: the supported ones are 3.11 (oldest stack), 3.12 (current), 3.13 (current-py313)" >&2
      return 2
    fi
    if [ -n "${KERNEL_CACHE_STACK:-}" ] && [ "$KERNEL_CACHE_STACK" != "$stack" ]; then
      echo "${who}PYTHON=$PYTHON is Python $minor, for the $stack stack, but KERNEL_CACHE_STACK=$KERNEL_CACHE_STACK (Python $(stack_python_version "$KERNEL_CACHE_STACK")): unset one of them" >&2
      return 2
    fi
    echo "$stack"; return 0
  fi
  if [ -n "${KERNEL_CACHE_STACK:-}" ]; then echo "$KERNEL_CACHE_STACK"; return 0; fi
  for stack in $STACK_PREFERENCE; do
    if [ -n "$(stack_python "$stack")" ]; then echo "$stack"; return 0; fi
  done
  echo "${who}no supported Python found on PATH or among pyenv's versions (3.12, 3.13 or 3.11); set PYTHON=/path/to/python3.12" >&2
  return 2
}

# One line naming stack $1 of checkout $2: its Python (the venv's, or the one that will make it), its pins, its venv.
describe_stack() {
  local stack="$1" root="$2" venv py pins="" line
  venv="$(stack_venv "$stack" "$root")"
  if [ -x "$venv/bin/python" ]; then py="$venv/bin/python"; else py="$(stack_python "$stack")"; fi
  if [ -f "$root/scripts/stacks/$stack.txt" ]; then
    while IFS= read -r line; do
      case "$line" in jax==*|triton==*|jax-triton==*|ejkernel==*) pins+="${pins:+, }${line/==/ }" ;; esac
    done < "$root/scripts/stacks/$stack.txt"
  fi
  if [ -n "$py" ]; then py="$("$py" -c 'import sys; print("Python %d.%d.%d" % sys.version_info[:3])' 2>/dev/null) (${py#"$root"/})"
  else py="Python $(stack_python_version "$stack") (none found yet)"; fi
  echo "the $stack stack: $py, $pins; venv ${venv#"$root"/}"
}
