# hk_publish_repo.cmake — publish one version of a kernel repo (all its variants) into a hub tree.
#
# Run by the target hk_add_kernel_repo creates:  cmake -DARGS_FILE=<publish_args.cmake> -P this
# The args file (generated at configure time) sets HUB_DIR, REPO, NAME, VERSION, BRANCH, TAGS,
# ABI_MAJOR, ABI_MINOR (this checkout's; a table's own minor wins), NO_TABLE, DUMP, SOURCE,
# BUILDER, DESCRIPTION (optional, provenance.description), BUILD_TYPE, OS, ARCH, LOCK_FILE, STAMP,
# VARIANTS, SIGNING_KEY and SIGNER (optional) and per variant
# VARIANT_<v>_FILE / _BACKEND / _BACKEND_VERSION / _ARCHS / _COMPILER.
#
# Steps: dump each library's table (the entries in metadata.json come from the .so itself) and
# check it names this repo, version and ABI; commit id = sha1 over repo, version and the sorted
# "variant sha256" lines (content-derived: same files → same commit); copy each library and write
# its metadata.json (digests and sizes of every file) via temp file + rename; with SIGNING_KEY,
# sign it (`SIGNER kernels sign --key SIGNING_KEY`, the hk CLI: metadata.json.sig beside it),
# otherwise remove a stale signature; point refs/tags/v<version> (+ TAGS) at the commit, and
# refs/heads/<branch> too unless it already points at a higher version; drop older commits of this
# same version. A per-repo file lock keeps parallel publishes of several versions consistent.
# It never touches other repos.
cmake_minimum_required(VERSION 3.25)
if(NOT ARGS_FILE)
  message(FATAL_ERROR "hk_publish_repo.cmake: pass -DARGS_FILE=...")
endif()
include(${ARGS_FILE})

function(json_quote out value)
  string(REPLACE "\\" "\\\\" value "${value}")
  string(REPLACE "\"" "\\\"" value "${value}")
  set(${out} "\"${value}\"" PARENT_SCOPE)
endfunction()

# Writes `content` to `path` through a temporary file and a rename (never a half-written file).
function(write_atomic path content)
  get_filename_component(dir "${path}" DIRECTORY)
  file(MAKE_DIRECTORY "${dir}")
  string(RANDOM LENGTH 8 suffix)
  file(WRITE "${path}.tmp-${suffix}" "${content}")
  file(RENAME "${path}.tmp-${suffix}" "${path}")
endfunction()

function(copy_atomic src dst)
  get_filename_component(dir "${dst}" DIRECTORY)
  file(MAKE_DIRECTORY "${dir}")
  string(RANDOM LENGTH 8 suffix)
  file(COPY_FILE "${src}" "${dst}.tmp-${suffix}")
  file(RENAME "${dst}.tmp-${suffix}" "${dst}")
endfunction()

# Version of the commit `commit` of this repo in the hub (from any of its metadata.json), or "".
function(commit_version out commit)
  set(${out} "" PARENT_SCOPE)
  file(GLOB metas "${HUB_DIR}/${REPO}/${commit}/build/*/metadata.json")
  foreach(meta ${metas})
    file(READ "${meta}" text)
    string(JSON v ERROR_VARIABLE err GET "${text}" version)
    if(NOT err)
      set(${out} "${v}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
endfunction()

set(lib_name "lib${NAME}.so")

# ---- dump every table, digest every file ---------------------------------------------------------
set(digest_lines "")
foreach(variant ${VARIANTS})
  set(file "${VARIANT_${variant}_FILE}")
  if(NOT EXISTS "${file}")
    message(FATAL_ERROR "publish ${REPO} ${VERSION}: ${file} was not built")
  endif()
  file(SHA256 "${file}" sha_${variant})
  file(SIZE "${file}" size_${variant})
  list(APPEND digest_lines "${variant} ${lib_name} ${sha_${variant}}")

  execute_process(COMMAND "${DUMP}" "${file}" OUTPUT_VARIABLE dump ERROR_VARIABLE dump_err
                  RESULT_VARIABLE dump_rc)
  set(abi_minor_${variant} ${ABI_MINOR})
  if(NOT dump_rc EQUAL 0)
    if(NO_TABLE AND dump_rc EQUAL 3)
      set(entries_${variant} "[]")
      continue()
    endif()
    message(FATAL_ERROR "publish ${REPO} ${VERSION}: cannot read the entry table of ${file}: "
                        "${dump_err}")
  endif()
  if(NO_TABLE)
    message(FATAL_ERROR "publish ${REPO} ${VERSION}: NO_TABLE given but ${file} has a table")
  endif()
  string(JSON t_repo GET "${dump}" repo)
  string(JSON t_version GET "${dump}" version)
  string(JSON t_abi GET "${dump}" abi major)
  if(NOT t_repo STREQUAL REPO OR NOT t_version STREQUAL VERSION OR NOT t_abi EQUAL ABI_MAJOR)
    message(FATAL_ERROR "publish ${REPO} ${VERSION}: ${file} says it is ${t_repo} ${t_version} "
                        "(ABI ${t_abi}); the library must be built by hk_add_kernel_repo with "
                        "HK_KERNEL_LIBRARY so its table matches the CMake call")
  endif()
  string(JSON entries_${variant} GET "${dump}" entries)
  string(JSON abi_minor_${variant} GET "${dump}" abi minor)
endforeach()

list(SORT digest_lines)
list(JOIN digest_lines "\n" digest_text)
string(SHA1 commit "${REPO}\n${VERSION}\n${digest_text}\n")

file(LOCK "${LOCK_FILE}" GUARD PROCESS TIMEOUT 300)

# ---- files and metadata ---------------------------------------------------------------------------
foreach(variant ${VARIANTS})
  set(dir "${HUB_DIR}/${REPO}/${commit}/build/${variant}")
  copy_atomic("${VARIANT_${variant}_FILE}" "${dir}/${lib_name}")

  set(backend "${VARIANT_${variant}_BACKEND}")
  json_quote(q_backend "${backend}")
  set(backend_json "{\"type\": ${q_backend}}")
  if(backend STREQUAL "cuda")
    json_quote(q_bv "${VARIANT_${variant}_BACKEND_VERSION}")
    string(JSON backend_json SET "${backend_json}" version "${q_bv}")
    set(archs_json "[]")
    set(i 0)
    foreach(a ${VARIANT_${variant}_ARCHS})
      json_quote(q_a "${a}")
      string(JSON archs_json SET "${archs_json}" ${i} "${q_a}")
      math(EXPR i "${i} + 1")
    endforeach()
    string(JSON backend_json SET "${backend_json}" archs "${archs_json}")
  endif()

  json_quote(q_name "${NAME}")
  json_quote(q_repo "${REPO}")
  json_quote(q_version "${VERSION}")
  json_quote(q_commit "${commit}")
  json_quote(q_variant "${variant}")
  json_quote(q_os "${OS}")
  json_quote(q_arch "${ARCH}")
  json_quote(q_lib "${lib_name}")
  json_quote(q_sha "${sha_${variant}}")
  json_quote(q_builder "${BUILDER}")
  json_quote(q_source "${SOURCE}")
  json_quote(q_compiler "${VARIANT_${variant}_COMPILER}")
  json_quote(q_build_type "${BUILD_TYPE}")
  set(meta "{}")
  string(JSON meta SET "${meta}" name "${q_name}")
  string(JSON meta SET "${meta}" repo "${q_repo}")
  string(JSON meta SET "${meta}" version "${q_version}")
  string(JSON meta SET "${meta}" id "${q_commit}")
  string(JSON meta SET "${meta}" variant "${q_variant}")
  string(JSON meta SET "${meta}" abi "{\"major\": ${ABI_MAJOR}, \"minor\": ${abi_minor_${variant}}}")
  string(JSON meta SET "${meta}" backend "${backend_json}")
  string(JSON meta SET "${meta}" os "${q_os}")
  string(JSON meta SET "${meta}" arch "${q_arch}")
  string(JSON meta SET "${meta}" library "${q_lib}")
  string(JSON meta SET "${meta}" entries "${entries_${variant}}")
  string(JSON meta SET "${meta}" digest "{\"sha256\": {${q_lib}: ${q_sha}}}")
  # The size lets a client stop a download at exactly the declared length.
  string(JSON meta SET "${meta}" size "{${q_lib}: ${size_${variant}}}")
  string(JSON meta SET "${meta}" provenance
         "{\"builder\": ${q_builder}, \"source\": ${q_source}, \"compiler\": ${q_compiler}, \"build_type\": ${q_build_type}}")
  if(DESCRIPTION)
    json_quote(q_description "${DESCRIPTION}")
    string(JSON meta SET "${meta}" provenance description "${q_description}")
  endif()
  write_atomic("${dir}/metadata.json" "${meta}\n")
  if(SIGNING_KEY)
    execute_process(COMMAND "${SIGNER}" kernels sign --key "${SIGNING_KEY}" "${dir}"
                    OUTPUT_QUIET ERROR_VARIABLE sign_err RESULT_VARIABLE sign_rc)
    if(NOT sign_rc EQUAL 0)
      message(FATAL_ERROR "publish ${REPO} ${VERSION}: signing ${dir}/metadata.json with "
                          "${SIGNING_KEY} failed: ${sign_err}")
    endif()
  else()
    file(REMOVE "${dir}/metadata.json.sig")  # a signature of older content would not verify
  endif()
endforeach()

# ---- refs -----------------------------------------------------------------------------------------
foreach(tag ${TAGS})
  write_atomic("${HUB_DIR}/${REPO}/refs/tags/${tag}" "${commit}\n")
endforeach()

set(branch_file "${HUB_DIR}/${REPO}/refs/heads/${BRANCH}")
set(move_branch TRUE)
if(EXISTS "${branch_file}")
  file(READ "${branch_file}" current)
  string(STRIP "${current}" current)
  if(NOT current STREQUAL commit)
    commit_version(current_version "${current}")
    if(current_version AND current_version VERSION_GREATER VERSION)
      set(move_branch FALSE)  # the branch already carries a newer release of this major
    endif()
  endif()
endif()
if(move_branch)
  write_atomic("${branch_file}" "${commit}\n")
endif()

# ---- drop earlier builds of this same version --------------------------------------------------
file(GLOB entries LIST_DIRECTORIES true "${HUB_DIR}/${REPO}/*")
foreach(path ${entries})
  get_filename_component(other "${path}" NAME)
  if(other MATCHES "^[0-9a-f]+$" AND NOT other STREQUAL commit)
    string(LENGTH "${other}" len)
    if(len EQUAL 40)
      commit_version(other_version "${other}")
      if(other_version STREQUAL VERSION)
        file(REMOVE_RECURSE "${path}")
      endif()
    endif()
  endif()
endforeach()

file(LOCK "${LOCK_FILE}" RELEASE)
file(WRITE "${STAMP}" "${commit}\n")
message(STATUS "published ${REPO} ${VERSION} as ${commit} (${VARIANTS})")
