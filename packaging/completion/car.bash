# bash completion for car and car-inferenced (installed as both names). The words come from the programs'
# own --help at completion time - CLI11's "Subcommands:" and option lists for car, the flag list for
# car-inferenced - so the completion follows the commands the installed binary actually has.

_car_help_words() {
  # $1: the section to read ("Subcommands" or "Options"); the rest: the command line to ask for --help.
  local section=$1
  shift
  "$@" --help 2>/dev/null | awk -v sec="$section" '
    /^[A-Za-z]+:$/ { insec = ($0 == sec ":"); next }
    insec && /^  [^ ]/ {
      if (sec == "Subcommands") { print $1; next }
      n = split($1, names, ",")
      for (i = 1; i <= n; i++) if (names[i] ~ /^-/) print names[i]
    }'
}

_car_model_ids() {
  # Model ids: those a running daemon lists (over the socket car would use; --socket on the line is
  # honoured), else the *.gguf files of CAR_INFERENCE_MODELS_DIR or the default models directory.
  local -a sock=()
  local i
  for ((i = 1; i < ${#COMP_WORDS[@]} - 1; i++)); do
    [[ ${COMP_WORDS[i]} == --socket ]] && sock=(--socket "${COMP_WORDS[i+1]}")
  done
  local ids
  ids=$("${COMP_WORDS[0]}" list --json --timeout 1 "${sock[@]}" 2>/dev/null |
    grep -o '"model": *"[^"]*"' | sed 's/.*"\([^"]*\)"$/\1/')
  if [ -z "$ids" ]; then
    local dir=${CAR_INFERENCE_MODELS_DIR:-/var/lib/car-inference/models}
    ids=$(cd "$dir" 2>/dev/null && for f in *.gguf; do [ -f "$f" ] && echo "${f%.gguf}"; done)
  fi
  printf '%s\n' "$ids"
}

_car() {
  local cur prev
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD-1]}
  case "$prev" in
    --socket|-o|--output|--config) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur")); return ;;
  esac
  # The subcommand path typed so far (words before the cursor that are not options or files).
  local -a cmd=("${COMP_WORDS[0]}")
  local i
  for ((i = 1; i < COMP_CWORD; i++)); do
    local w=${COMP_WORDS[i]}
    [[ $w == -* ]] && continue
    if _car_help_words Subcommands "${cmd[@]}" | grep -qxF -- "$w"; then cmd+=("$w"); fi
  done
  local words
  if [[ $cur == -* ]]; then
    words=$(_car_help_words Options "${cmd[@]}")
  else
    words=$(_car_help_words Subcommands "${cmd[@]}")
    # The model argument (the first word after the command) of the commands that take one: ids, and for
    # the offline ones files too.
    local n_args=0
    for ((i = ${#cmd[@]}; i < COMP_CWORD; i++)); do
      [[ ${COMP_WORDS[i]} == -* || ${COMP_WORDS[i-1]} == --socket || ${COMP_WORDS[i-1]} == --timeout ]] || ((n_args++))
    done
    if [ ${#cmd[@]} -eq 2 ] && [ "$n_args" -eq 0 ]; then
      case "${cmd[1]}" in
        infer|load|invalidate|chat)
          COMPREPLY=($(compgen -W "$(_car_model_ids)" -- "$cur"))
          return ;;
        run|show|bench)
          compopt -o filenames 2>/dev/null
          COMPREPLY=($(compgen -W "$(_car_model_ids)" -- "$cur") $(compgen -f -- "$cur"))
          return ;;
      esac
    fi
    if [ -z "$words" ]; then
      # A leaf command: model files and the like.
      compopt -o filenames 2>/dev/null
      COMPREPLY=($(compgen -f -- "$cur"))
      return
    fi
  fi
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}

_car_inferenced() {
  local cur prev
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD-1]}
  if [[ $prev == --config || $prev == --socket || $prev == --models-dir || $prev == --state-dir ]]; then
    compopt -o filenames 2>/dev/null
    COMPREPLY=($(compgen -f -- "$cur"))
    return
  fi
  # car-inferenced --help lists "  --flag VALUE  (VARIABLE)" lines.
  local words
  words=$("${COMP_WORDS[0]}" --help 2>/dev/null | awk '/^  --[a-z]/ { print $1 }')
  COMPREPLY=($(compgen -W "$words --version --help" -- "$cur"))
}

complete -F _car car
complete -F _car_inferenced car-inferenced
